-- import: insert a whole job from an export.
-- Args: tube, client id ('' for a server id), key, mode, pri, delay ms,
-- ttr ms, body, options ('' for none: a job's options were fixed at its
-- put, so the tube's settings do not fill them in), state, time left ms,
-- when it was put (ms since the epoch), burial order, reserves, timeouts,
-- releases, buries, kicks, tries, dead (1 or 0).
-- `key`: for a server id, the id's key in hex; for a client id on a
-- cluster, the key the caller took for it (on one Redis the key comes from
-- the sequence, by `claim`). `mode`, for a server id on a cluster:
--   'keep'   the control slot's `claim` allowed the key;
--   'same'   it did not: only say whether the job is here.
-- Returns the job's id; 0 if its client id is taken or the same job is
-- here already (same tube and body, put within a second of each other);
-- -1 if the key may not be kept (the caller puts the job under a new key).
OPS.import = function(tube, name, key, mode, pri, delay, ttr, body, options, state, left, created, order, reserves,
                      timeouts, releases, buries, kicks, tries, dead)
  created = tonumber(created)
  local held
  if name ~= '' then
    if name_taken(name) then return 0 end
    if key ~= '' and redis.call('HEXISTS', P .. 'jobs', key) == 1 then
      return redis.error_reply('delayq: job key ' .. key .. ' is taken (the key sequence went back)')
    end
  else
    held = load(key)
    if held ~= nil and held[NAME] == '' and held[TUBE] == tube and held[BODY] == body
        and math.abs(held[CREATED] - created) <= 1000 then
      return 0
    end
    if SHARDED and (mode == 'same' or held ~= nil) then return -1 end
  end
  if not SHARDED then
    -- On one Redis the key comes from the sequence here. Keys this call
    -- took ahead for its puts go back first, so that every key a put has
    -- had is at most the sequence when `claim` looks at it, and the puts
    -- after this take theirs beyond the imported one.
    if seq_next ~= nil and seq_next <= seq_last then
      redis.call('DECRBY', P .. 'seq', seq_last - seq_next + 1)
    end
    seq_next, seq_last = nil, nil
    local wanted = 0
    if name == '' and held == nil then wanted = tonumber(key, 16) end
    key = string.format('%012x', claim(wanted))
  end
  ensure_tube(tube)
  count(tube_key('tube', tube), 'total', 1)
  count(P .. 'totals', 'jobs', 1)
  if name ~= '' then redis.call('HSET', P .. 'names', name, key) end
  reserves = tonumber(reserves)
  local job = { '', tonumber(pri), tonumber(delay), tonumber(ttr), created, 0, '', tube, name, reserves,
    tonumber(timeouts), tonumber(releases), tonumber(buries), tonumber(kicks), body }
  if options ~= '' then
    job[OPTIONS], job[ROUND], job[DEAD] = options, math.max(reserves - tonumber(tries), 0), 0
    if state == 'buried' then job[DEAD] = tonumber(dead) end
    expires(key, job)
  end
  left, order = tonumber(left), tonumber(order)
  if state == 'delayed' and left > 0 then
    link(key, job, 'delayed', from_now(left))
  elseif state == 'buried' then
    -- On one Redis burials are numbered by a sequence, which must go on
    -- after this one; on a cluster by Redis time, which does.
    if not SHARDED and order > tonumber(redis.call('GET', P .. 'bury-seq') or '0') then
      redis.call('SET', P .. 'bury-seq', order)
    end
    link(key, job, 'buried', order)
  else
    link(key, job, 'ready', 0)
  end
  return id_of(key, job)
end
