-- attach / detach: a connection starts or stops using or watching a tube.
-- ARGV: prefix, tube, 'using' | 'watching', +1 | -1
local tube, field, delta = ARGV[2], ARGV[3], tonumber(ARGV[4])
if delta > 0 then
  ensure_tube(tube)
  redis.call('HINCRBY', tube_key('tube', tube), field, delta)
elseif redis.call('ZSCORE', P .. 'tubes', tube) then
  local t = tube_key('tube', tube)
  if tonumber(redis.call('HGET', t, field) or 0) > 0 then redis.call('HINCRBY', t, field, -1) end
  forget_if_unused(tube)
end
return 1
