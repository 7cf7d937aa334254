-- pause-tube: hold back a tube's jobs for `delay` ms (0 resumes it).
-- ARGV: prefix, tube, delay ms
-- Returns 1, or 0 if the tube does not exist.
local tube, delay = ARGV[2], tonumber(ARGV[3])
if not redis.call('ZSCORE', P .. 'tubes', tube) then return 0 end
local t = tube_key('tube', tube)
redis.call('HINCRBY', t, 'cmd-pause-tube', 1)
if delay > 0 then
  local until_ms = now_ms() + delay
  redis.call('HSET', t, 'pause', delay, 'until', until_ms)
  redis.call('ZADD', P .. 'pauses', until_ms, tube)
else
  redis.call('HDEL', t, 'pause', 'until')
  redis.call('ZREM', P .. 'pauses', tube)
  announce(tube)
end
return 1
