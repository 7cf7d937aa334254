-- list-tubes: every tube, oldest first.
-- Args: none
-- Returns the tube names; on a cluster, each followed by when it was first
-- seen there, to merge the lists, and whether it lives there (1) or not
-- (0: the control slot only remembers when it was first seen, or a shard
-- only keeps its counts).
OPS.list_tubes = function()
  if not SHARDED then return redis.call('ZRANGE', P .. 'tubes', 0, -1) end
  local got = redis.call('ZRANGE', P .. 'tubes', 0, -1, 'WITHSCORES')
  local out = {}
  for i = 1, #got, 2 do
    local live = 1
    if CONTROL and got[i] ~= 'default' then
      local using, watching = tube_users(got[i])
      if using + watching == 0 then live = 0 end
    end
    out[#out + 1], out[#out + 2], out[#out + 3] = got[i], got[i + 1], live
  end
  if not CONTROL then
    -- Dormant tubes come last, with no time of their own (the merge takes
    -- the earliest), so that one gone from every shard is forgotten.
    for _, tube in ipairs(redis.call('ZRANGE', P .. 'dormant', 0, -1)) do
      if redis.call('EXISTS', tube_key('tube', tube)) == 1 then
        out[#out + 1], out[#out + 2], out[#out + 3] = tube, '+inf', 0
      else
        -- Its counts expired.
        redis.call('ZREM', P .. 'dormant', tube)
      end
    end
  end
  return out
end

