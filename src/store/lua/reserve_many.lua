-- reserve-many: take up to `count` jobs at once, each as `reserve` would,
-- in the order it would take them one by one.
-- Args: owner, the tubes separated by spaces, the most to take, and the
-- least urgent priority to take ('' for any): on a shard of a cluster, the
-- priority of the best job another shard has, so that a batch taken from
-- several shards keeps to priority order (see `reserve_sharded`)
-- Returns a list of {id, tube, body, ttr}, possibly empty, and 0 after
-- them if a tube's rate held back the rest (see `reserve`).
OPS.reserve_many = function(owner, tubes, most, upto)
  most, upto = tonumber(most), tonumber(upto)
  local one = not string.find(tubes, ' ', 1, true)
  if one and not paused(tubes) and rate_of(tubes) == nil then
    -- One tube with no rate to count: the jobs are taken, read, held and
    -- written back in one command each, not one per job.
    local tube = tubes
    local ready = tube_key('ready', tube)
    local keys = {}
    if upto == nil then
      local popped = redis.call('ZPOPMIN', ready, most)
      for i = 1, #popped, 2 do keys[#keys + 1] = popped[i] end
    else
      -- The ready set's score is the priority; members of one score are in
      -- key order, which is FIFO order.
      keys = redis.call('ZRANGE', ready, '-inf', upto, 'BYSCORE', 'LIMIT', 0, most)
      if #keys > 0 then redis.call('ZREM', ready, unpack(keys)) end
    end
    if #keys == 0 then
      -- None here (or none as urgent as asked): the caller's process
      -- learns what this shard's first is, as after `reserve`.
      touched[tube] = true
      return {}
    end
    local raws = redis.call('HMGET', P .. 'jobs', unpack(keys))
    local out, deadlines, saved, first = {}, {}, {}, nil
    for i, key in ipairs(keys) do
      local job = cmsgpack.unpack(raws[i])
      -- As `reserve_key` and `link` do, one job at a time.
      unlink(key, job, true)
      job[RESERVES], job[OWNER] = job[RESERVES] + 1, owner
      local at = from_now(job[TTR])
      job[STATE], job[AT] = 'reserved', at
      count(tube_key('tube', tube), 'reserved', 1)
      deadlines[#deadlines + 1], deadlines[#deadlines + 2] = at, key
      saved[#saved + 1], saved[#saved + 2] = key, cmsgpack.pack(job)
      if first == nil or at < first then first = at end
      out[#out + 1] = { id_of(key, job), job[TUBE], job[BODY], job[TTR] }
    end
    redis.call('ZADD', P .. 'reserved', unpack(deadlines))
    redis.call('HSET', P .. 'jobs', unpack(saved))
    if SHARDED then wake_by(first) end
    return out
  end
  local out = {}
  for _ = 1, most do
    if upto ~= nil and one then
      local first = redis.call('ZRANGE', tube_key('ready', tubes), 0, 0, 'WITHSCORES')
      if first[2] == nil or tonumber(first[2]) > upto then break end
    end
    local got = OPS.reserve(owner, tubes)
    if got == 0 then
      out[#out + 1] = 0
      break
    end
    if not got then break end
    out[#out + 1] = got
  end
  return out
end
