-- put: insert a job, ready or delayed.
-- Args: tube, client id ('' for a server id), pri, delay ms, ttr ms, body,
-- options ('' for none; the tube's settings fill in those unset)
-- Returns the job's id (its server id as a number, or its client id), or 0
-- when the client id exists already.
OPS.put = function(tube, name, pri, delay, ttr, body, options)
  -- On a cluster the caller chooses the key, from the cluster-wide
  -- sequence, so keys across shards follow the order of the puts: `name`
  -- is '#'..key for a server id, or key..'#'..client id (no client id has
  -- a '#').
  local key
  if SHARDED then
    local at = string.find(name, '#', 1, true)
    key, name = string.sub(name, 1, at - 1), string.sub(name, at + 1)
    if key == '' then key, name = name, '' end
    -- Should the control slot's primary fail before its replica had the
    -- sequence's last step, keys are handed out again: a job never
    -- replaces another. (The put fails; the producer tries again.)
    if redis.call('HEXISTS', P .. 'jobs', key) == 1 then
      return redis.error_reply('delayq: job key ' .. key .. ' is taken (the key sequence went back)')
    end
  end
  if name ~= '' and name_taken(name) then return 0 end
  pri, delay, ttr = tonumber(pri), tonumber(delay), tonumber(ttr)
  local now = now_ms()
  key = key or next_key()
  ensure_tube(tube)
  count(tube_key('tube', tube), 'total', 1)
  count(P .. 'totals', 'jobs', 1)
  if name ~= '' then redis.call('HSET', P .. 'names', name, key) end
  local job = { '', pri, delay, ttr, now, 0, '', tube, name, 0, 0, 0, 0, 0, body }
  options = with_settings(options, tube)
  if options ~= '' then
    job[OPTIONS], job[ROUND], job[DEAD] = options, 0, 0
    expires(key, job)
  end
  if delay > 0 then
    link(key, job, 'delayed', from_now(delay))
  else
    link(key, job, 'ready', 0)
  end
  return id_of(key, job)
end
