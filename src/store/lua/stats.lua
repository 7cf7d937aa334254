-- stats: job figures over all tubes.
-- Args: none
-- Returns {urgent, ready, reserved, delayed, buried, timeouts, total jobs,
-- tubes, expired}.
OPS.stats = function()
  write_counts()
  local urgent, ready, delayed, buried = 0, 0, 0, 0
  local tubes = redis.call('ZRANGE', P .. 'tubes', 0, -1)
  for _, tube in ipairs(tubes) do
    local c = redis.call('HMGET', tube_key('tube', tube), 'urgent', 'delayed')
    urgent = urgent + tonumber(c[1] or 0)
    ready = ready + redis.call('ZCARD', tube_key('ready', tube))
    delayed = delayed + tonumber(c[2] or 0)
    buried = buried + redis.call('ZCARD', tube_key('buried', tube))
  end
  local totals = redis.call('HMGET', P .. 'totals', 'timeouts', 'jobs', 'expired')
  return { urgent, ready, redis.call('ZCARD', P .. 'reserved'), delayed, buried,
    tonumber(totals[1] or 0), tonumber(totals[2] or 0), #tubes, tonumber(totals[3] or 0) }
end
