-- pauses: the paused tubes and how long each pause has left, in ms. On a
-- cluster pauses are kept in the control slot, and every process keeps
-- these in mind to leave paused tubes out of the shards' reserves.
-- Args: none
-- Returns {tube, ms left, ...}.
OPS.pauses = function()
  local out = {}
  local now = now_ms()
  local p = redis.call('ZRANGEBYSCORE', P .. 'pauses', '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #p, 2 do
    out[#out + 1] = p[i]
    out[#out + 1] = tonumber(p[i + 1]) - now
  end
  return out
end
