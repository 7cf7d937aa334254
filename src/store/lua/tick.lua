-- tick: move what has fallen due, at most `batch` jobs per call.
-- Delayed jobs become ready; reserved jobs past their deadline come back
-- (a timeout: ready, delayed by their backoff, or buried if they used up
-- their tries); paused tubes whose pause ended resume. It also renews this
-- process's alive mark and forgets the processes whose mark has been
-- missing for a while: their tube users stop counting, and tubes left with
-- no users or jobs go away.
-- Args: batch, process
-- Returns {next, lost, tube...}: microseconds until the next due time (0:
-- call again now; -1: nothing pending), 1 if the process's use and watch
-- counts are gone from Redis (else 0), then the tubes that got ready jobs.
-- Due times are whole milliseconds; the wait is counted to the
-- microsecond, so the timer wakes as the millisecond begins, not up to one
-- later.

-- Set by the heartbeat when the process's counts are gone from Redis.
local lost_refs = 0

local function heartbeat(process)
  -- How long another process's alive mark must be seen missing before it
  -- is taken for dead, and how long that sighting is kept.
  local DEAD_AFTER_MS, MISSING_KEPT_MS = 2000, 10000
  alive(process)
  local now = now_ms()
  for _, other in ipairs(redis.call('SMEMBERS', P .. 'processes')) do
    if redis.call('EXISTS', P .. 'alive:' .. other) == 0 then
      -- Gone only once its mark has been seen missing for DEAD_AFTER_MS:
      -- after Redis was away or frozen every mark has expired, and the
      -- process that calls first would otherwise forget the others, alive
      -- and about to call too.
      local missing = P .. 'missing:' .. other
      local since = tonumber(redis.call('GET', missing))
      if since == nil then
        redis.call('SET', missing, now, 'PX', MISSING_KEPT_MS)
      elseif now - since >= DEAD_AFTER_MS then
        local refs = P .. 'refs:' .. other
        local fields = redis.call('HKEYS', refs)
        redis.call('DEL', refs, P .. 'refv:' .. other, missing)
        redis.call('SREM', P .. 'processes', other)
        for _, field in ipairs(fields) do
          if field ~= '#' then maybe_unused(string.sub(field, 3)) end
        end
      end
    end
  end
  -- Its counts were forgotten (it was taken for dead) or lost (Redis lost
  -- its data): the process sends them all again.
  if redis.call('HEXISTS', P .. 'refs:' .. process, '#') == 0 then
    lost_refs = 1
    -- Until every process has beaten again, a call that found only one
    -- process may have told nobody of the jobs it made ready (see
    -- `others`): every process serves all its waiting workers anew. (On a
    -- cluster every shard's news goes out whatever the processes.)
    if not SHARDED and not CONTROL then
      redis.call('PUBLISH', P .. 'events', 'resync:')
    end
  end
end

local function ticked(next_ms)
  local out = { next_ms, lost_refs }
  for tube in pairs(announced) do out[#out + 1] = tube end
  return out
end

-- Opening ahead (OPEN_AHEAD) gets a tick's budget only after the due jobs
-- of every tube are moved (opened first, a full bucket took each tick's
-- whole budget for several ticks, and the jobs falling due meanwhile, in
-- any tube, waited for all of them), and only a few jobs of it: a
-- tick is one call, which holds up every other call to Redis while it
-- runs, and 250 jobs opened in one took 1 to 2 ms (the tail of the jobs'
-- lateness); the rest is opened by the ticks that follow at once.
local AHEAD_BATCH = 64

-- Opens the tube's buckets of the seconds up to `last`: their jobs go into
-- the tube's `soon` set, ordered to the millisecond, so no tick scans a
-- whole bucket. Returns the budget left.
local function open_buckets(tube, last, budget)
  if budget <= 0 then return budget end
  local buckets, soon = tube_key('delayed', tube), tube_key('soon', tube)
  for _, second in ipairs(redis.call('ZRANGEBYSCORE', buckets, '-inf', last, 'LIMIT', 0, budget)) do
    second = tonumber(second)
    local bucket = P .. 'bucket:' .. tube .. ':' .. second
    -- One ZADD for all the popped jobs, unsorted (the set orders them):
    -- a ZADD and a sort per job made opening cost about 8 us a job, and a
    -- full bucket's ticks held due jobs up for milliseconds.
    local members = redis.call('SPOP', bucket, budget)
    local scored = {}
    for i, m in ipairs(members) do
      scored[2 * i - 1], scored[2 * i] = bucket_entry(second, m)
    end
    if #members > 0 then redis.call('ZADD', soon, unpack(scored)) end
    budget = budget - #members
    if redis.call('EXISTS', bucket) == 1 or budget <= 0 then break end
    redis.call('ZREM', buckets, second)
  end
  return budget
end

-- Moves the due jobs of one tube; returns the budget left, negative or zero
-- if it ran out before the tube was done. A bucket whose second has begun
-- holds jobs already due: it is opened first, so that due jobs are moved
-- in the order of their due times.
local function move_due(tube, now, budget)
  budget = open_buckets(tube, math.floor(now / 1000), budget)
  local soon = tube_key('soon', tube)
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', soon, '-inf', now, 'LIMIT', 0, math.max(budget, 0))) do
    local job = load(key)
    unlink(key, job)
    link(key, job, 'ready', 0)
    budget = budget - 1
  end
  return budget
end

-- Puts the tube's next due time in the `due` index: its soonest job in
-- `soon`, or the opening of its next bucket, whichever comes first (now or
-- earlier if a tick's budget left either undone).
local function reschedule(tube)
  local next_due = redis.call('ZRANGE', tube_key('soon', tube), 0, 0, 'WITHSCORES')[2]
  local next_second = redis.call('ZRANGE', tube_key('delayed', tube), 0, 0)[1]
  if next_second then
    local at = (tonumber(next_second) - OPEN_AHEAD) * 1000
    if next_due == nil or at < tonumber(next_due) then next_due = at end
  end
  if next_due == nil then
    redis.call('ZREM', P .. 'due', tube)
  else
    redis.call('ZADD', P .. 'due', next_due, tube)
  end
end

OPS.tick = function(batch, process)
  local now, budget = now_ms(), tonumber(batch)
  lost_refs = 0
  -- A shard of a cluster is ticked without a process: the processes mark
  -- themselves alive in the cluster's control slot instead.
  if process ~= '' then heartbeat(process) end

  local tubes = redis.call('ZRANGEBYSCORE', P .. 'due', '-inf', now, 'LIMIT', 0, budget)
  for _, tube in ipairs(tubes) do
    budget = move_due(tube, now, budget)
    if budget <= 0 then break end
  end
  local ahead, left = math.floor(now / 1000) + OPEN_AHEAD, math.min(budget, AHEAD_BATCH)
  for _, tube in ipairs(tubes) do
    local after = open_buckets(tube, ahead, left)
    budget, left = budget - (left - after), after
    reschedule(tube)
  end
  if budget <= 0 then return ticked(0) end

  local expired = redis.call('ZRANGEBYSCORE', P .. 'reserved', '-inf', now, 'LIMIT', 0, budget)
  for _, key in ipairs(expired) do
    local job = load(key)
    job[TIMEOUTS] = job[TIMEOUTS] + 1
    if not gone_if_expired(key, job) then
      unlink(key, job)
      job[OWNER] = ''
      come_back(key, job)
    end
  end
  if #expired > 0 then count(P .. 'totals', 'timeouts', #expired) end
  budget = budget - #expired
  if budget <= 0 then return ticked(0) end

  -- Jobs whose time to live ran out: removed, unless a worker holds one,
  -- which then goes when it is let go of.
  local ended = redis.call('ZRANGEBYSCORE', P .. 'expiries', '-inf', now,
    'WITHSCORES', 'LIMIT', 0, budget)
  for i = 1, #ended, 2 do
    local key = ended[i]
    redis.call('ZREM', P .. 'expiries', key)
    local job = load(key)
    if job ~= nil and job[STATE] == 'reserved' then
      job[EXPIRED] = 1
      save(key, job)
    elseif job ~= nil then
      -- Gone when its time ran out (its unique window counts from then),
      -- not when this tick came, which after an outage is much later.
      expire(key, job, tonumber(ended[i + 1]))
    end
  end
  budget = budget - #ended / 2
  if budget <= 0 then return ticked(0) end

  -- Client ids whose unique window ended are free again (a put checks the
  -- window's end itself, so this only keeps the set small).
  local freed = redis.call('ZRANGEBYSCORE', P .. 'taken', '-inf', now, 'LIMIT', 0, budget)
  if #freed > 0 then redis.call('ZREM', P .. 'taken', unpack(freed)) end
  budget = budget - #freed
  if budget <= 0 then return ticked(0) end

  -- Tubes whose rate held reserves back: a new second has begun.
  for _, tube in ipairs(redis.call('ZRANGEBYSCORE', P .. 'limited', '-inf', now)) do
    redis.call('ZREM', P .. 'limited', tube)
    touched[tube] = true
    announce(tube)
  end

  for _, tube in ipairs(redis.call('ZRANGEBYSCORE', P .. 'pauses', '-inf', now)) do
    redis.call('ZREM', P .. 'pauses', tube)
    redis.call('HDEL', tube_key('tube', tube), 'pause', 'until')
    pause_until[tube] = 0
    -- On a shard of a cluster, its first ready job goes out with the news
    -- (see `heads`), so the workers of every process are served.
    touched[tube] = true
    announce(tube)
  end

  local next_at = -1
  for _, index in ipairs({ 'due', 'reserved', 'pauses', 'expiries', 'limited', 'taken' }) do
    local first = redis.call('ZRANGE', P .. index, 0, 0, 'WITHSCORES')
    if first[2] then
      local at = tonumber(first[2])
      -- Ended windows are freed together, once a second at most.
      if index == 'taken' then at = at + TAKEN_SLACK_MS end
      if next_at < 0 or at < next_at then next_at = at end
    end
  end
  if SHARDED then
    -- What this tick found pending is what the process ticking the shard
    -- waits for: an earlier due time created later is announced.
    if next_at < 0 then redis.call('DEL', P .. 'wake') else redis.call('SET', P .. 'wake', next_at) end
  end
  if next_at < 0 then return ticked(-1) end
  return ticked(math.max(next_at * 1000 - clock_us, 0))
end
