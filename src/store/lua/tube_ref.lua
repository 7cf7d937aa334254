-- attach / detach: a connection of `process` starts or stops using or
-- watching a tube.
-- Args: process, tube, 'u' (using) | 'w' (watching), +1 | -1
-- Returns 1.
OPS.tube_ref = function(process, tube, field, delta)
  delta = tonumber(delta)
  local refs, name = P .. 'refs:' .. process, field .. ':' .. tube
  alive(process)
  if delta > 0 then
    ensure_tube(tube)
    redis.call('HINCRBY', refs, name, delta)
  elseif tonumber(redis.call('HGET', refs, name) or 0) > 0 then
    if redis.call('HINCRBY', refs, name, delta) <= 0 then redis.call('HDEL', refs, name) end
    maybe_unused(tube)
  end
  return 1
end
