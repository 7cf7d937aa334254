-- pause-tube: hold back a tube's jobs for `delay` ms (0 resumes it).
-- Args: tube, delay ms, '1' if the caller knows the tube exists elsewhere
-- (on a cluster, pauses are kept in the control slot, and a tube may
-- exist only by its jobs in the shards)
-- Returns when the pause ends, in ms of Redis's clock (0 if resumed), for
-- a cluster's shards to hold it too (`hold_tube`); false if the tube does
-- not exist.
OPS.pause_tube = function(tube, delay, exists)
  delay = tonumber(delay)
  if exists == '1' then ensure_tube(tube) end
  if not redis.call('ZSCORE', P .. 'tubes', tube) then return false end
  local t = tube_key('tube', tube)
  count(t, 'cmd-pause-tube', 1)
  if delay > 0 then
    local until_ms = from_now(delay)
    redis.call('HSET', t, 'pause', delay, 'until', until_ms)
    redis.call('ZADD', P .. 'pauses', until_ms, tube)
    pause_until[tube] = until_ms
    return until_ms
  end
  redis.call('HDEL', t, 'pause', 'until')
  redis.call('ZREM', P .. 'pauses', tube)
  pause_until[tube] = 0
  announce(tube)
  return 0
end
