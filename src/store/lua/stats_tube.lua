-- stats-tube: a tube's figures.
-- Args: tube
-- Returns {urgent, ready, reserved, delayed, buried, total, using, watching,
--          cmd-delete, cmd-pause-tube, pause ms, pause ms left, expired} or false.
OPS.stats_tube = function(tube)
  write_counts()
  local listed = redis.call('ZSCORE', P .. 'tubes', tube)
  -- On a shard of a cluster, the counts a shard keeps of a tube it no
  -- longer holds jobs of count too, and a 14th figure says whether the
  -- shard holds it now.
  if not listed and not (SHARDED and redis.call('EXISTS', tube_key('tube', tube)) == 1) then
    return false
  end
  local t = redis.call('HMGET', tube_key('tube', tube), 'urgent', 'reserved', 'total', 'cmd-delete',
    'cmd-pause-tube', 'pause', 'until', 'delayed', 'expired')
  local n = function(i) return tonumber(t[i] or 0) end
  local now = now_ms()
  local using, watching = tube_users(tube)
  local pause, left = 0, 0
  if n(7) > now then pause, left = n(6), math.max(n(7) - from_now(0), 0) end
  local out = { n(1), redis.call('ZCARD', tube_key('ready', tube)), n(2),
    n(8), redis.call('ZCARD', tube_key('buried', tube)),
    n(3), using, watching, n(4), n(5), pause, left, n(9) }
  if CONTROL then
    out[14] = (using + watching > 0 or tube == 'default') and 1 or 0
  elseif SHARDED then
    out[14] = listed and 1 or 0
  end
  return out
end
