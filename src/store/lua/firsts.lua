-- firsts: the first `n` jobs of a tube in one state, in the order that
-- state's commands take them (ready: priority, then key; delayed: due
-- time; buried: burial time), so the shards of a cluster can be merged.
-- Args: tube, 'ready' | 'delayed' | 'buried', n
-- Returns {score, key, ...}.
OPS.firsts = function(tube, kind, n)
  n = tonumber(n)
  local out = {}
  if n <= 0 then return out end
  if kind == 'delayed' then
    for _, j in ipairs(first_delayed(tube, n)) do
      out[#out + 1], out[#out + 2] = j[1], j[2]
    end
    return out
  end
  local got = redis.call('ZRANGE', tube_key(kind, tube), 0, n - 1, 'WITHSCORES')
  for i = 1, #got, 2 do
    out[#out + 1], out[#out + 2] = tonumber(got[i + 1]), got[i]
  end
  return out
end
