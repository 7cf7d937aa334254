-- live: the delayq processes whose alive mark has not expired, so that
-- each can work out which shards it ticks.
-- Args: none
-- Returns the process names, sorted.
OPS.live = function()
  local out = {}
  for _, process in ipairs(redis.call('SMEMBERS', P .. 'processes')) do
    if redis.call('EXISTS', P .. 'alive:' .. process) == 1 then out[#out + 1] = process end
  end
  table.sort(out)
  return out
end
