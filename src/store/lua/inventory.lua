-- inventory: the tubes of this key space that have ready jobs, for a
-- process that starts, or lost its connection to a shard's news, to learn
-- where to look. On a shard of a cluster they go back as the call's heads
-- (see `heads` in the prelude), with their first ready jobs.
-- Args: none
-- Returns the tube names.
OPS.inventory = function()
  local out = {}
  for _, tube in ipairs(redis.call('ZRANGE', P .. 'tubes', 0, -1)) do
    if redis.call('ZCARD', tube_key('ready', tube)) > 0 then
      out[#out + 1] = tube
      touched[tube] = true
    end
  end
  return out
end
