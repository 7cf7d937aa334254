-- attach / detach: a connection of `process` starts or stops using or
-- watching a tube.
-- ARGV: prefix, process, tube, 'u' (using) | 'w' (watching), +1 | -1
local process, tube, field, delta = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local refs, name = P .. 'refs:' .. process, field .. ':' .. tube
heartbeat(process)
if delta > 0 then
  ensure_tube(tube)
  redis.call('HINCRBY', refs, name, delta)
elseif tonumber(redis.call('HGET', refs, name) or 0) > 0 then
  if redis.call('HINCRBY', refs, name, delta) <= 0 then redis.call('HDEL', refs, name) end
  forget_if_unused(tube)
end
return 1
