-- tube_ref: the connections of `process` using or watching a tube changed;
-- the process sends its new count, not the change, so that a call sent
-- twice, or one whose command was answered as failed and then undone,
-- leaves the count the process has; and the count's version, so that a
-- count older than the one Redis has (its call sent again, late) changes
-- nothing (see `latest_ref`).
-- Args: process, tube, 'u' (using) | 'w' (watching), the count, its version
-- Returns 1.
OPS.tube_ref = function(process, tube, field, count, version)
  count = tonumber(count)
  local refs, name = P .. 'refs:' .. process, field .. ':' .. tube
  alive(process)
  if not latest_ref(process, name, version) then return 1 end
  if count > 0 then
    ensure_tube(tube)
    redis.call('HSET', refs, name, count)
  elseif redis.call('HDEL', refs, name) == 1 then
    maybe_unused(tube)
  end
  return 1
end
