-- set-schedule: register, replace or remove a schedule (kept whole, as
-- the Rust side encodes it), and tell the other processes, which fire it too.
-- Args: name, encoded schedule ('' removes it), the most schedules kept
-- Returns 1 if it was set or removed, 0 if there was none to remove or it
-- is new and the store is full.
OPS.set_schedule = function(name, encoded, most)
  local n
  if encoded == '' then
    n = redis.call('HDEL', P .. 'schedules', name)
  elseif redis.call('HEXISTS', P .. 'schedules', name) == 0
      and redis.call('HLEN', P .. 'schedules') >= tonumber(most) then
    n = 0
  else
    redis.call('HSET', P .. 'schedules', name, encoded)
    n = 1
  end
  if n == 1 then tell('schedules:') end
  return n
end
