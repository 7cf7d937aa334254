-- forget_counts: a shard of a cluster drops the counts it kept of tubes
-- it no longer holds jobs of, once a process found those tubes gone
-- everywhere: a tube made anew counts from zero.
-- Args: tube names separated by spaces
-- Returns 1.
OPS.forget_counts = function(tubes)
  for tube in string.gmatch(tubes, '[^ ]+') do
    if not redis.call('ZSCORE', P .. 'tubes', tube) then
      redis.call('DEL', tube_key('tube', tube))
      redis.call('ZREM', P .. 'dormant', tube)
    end
  end
  return 1
end
