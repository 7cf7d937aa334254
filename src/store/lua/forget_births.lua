-- forget_births: the control slot forgets when these tubes were first
-- seen, and the counts it kept of them, unless they have users again (a
-- process found them nowhere else).
-- Args: tube names separated by spaces
-- Returns 1.
OPS.forget_births = function(tubes)
  for tube in string.gmatch(tubes, '[^ ]+') do
    local using, watching = tube_users(tube)
    if using + watching == 0 and tube ~= 'default' then
      redis.call('ZREM', P .. 'tubes', tube)
      redis.call('ZREM', P .. 'pauses', tube)
      redis.call('DEL', tube_key('tube', tube))
    end
  end
  return 1
end
