-- put: insert a job, ready or delayed.
-- Args: tube, client id ('' for a server id), pri, delay ms, ttr ms, body
-- Returns the job's id (its server id as a number, or its client id), or 0
-- when the client id exists already.
OPS.put = function(tube, name, pri, delay, ttr, body)
  if name ~= '' and redis.call('HEXISTS', P .. 'names', name) == 1 then return 0 end
  pri, delay, ttr = tonumber(pri), tonumber(delay), tonumber(ttr)
  local now = now_ms()
  local key = next_key()
  ensure_tube(tube)
  count(tube_key('tube', tube), 'total', 1)
  count(P .. 'totals', 'jobs', 1)
  if name ~= '' then redis.call('HSET', P .. 'names', name, key) end
  local job = { '', pri, delay, ttr, now, 0, '', tube, name, 0, 0, 0, 0, 0, body }
  if delay > 0 then
    link(key, job, 'delayed', from_now(delay))
  else
    link(key, job, 'ready', 0)
  end
  return id_of(key, job)
end
