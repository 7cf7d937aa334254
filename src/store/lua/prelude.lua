-- delayq's Redis function library is this prelude, the files of the
-- operations (each adds a function to OPS), then `batch.lua`, the dispatcher
-- that runs the operations a call asks for, in order, and finishes the call;
-- delayq appends the registration of one function per kind of call.
--
-- The first argument of every call is the key prefix including its hash
-- tag, such as "{delayq:}". Every key begins with it, so every key a call
-- touches lies in one hash slot. The one declared key is always P.."jobs",
-- so that a cluster routes the call to that slot's node; the other keys are
-- derived here from the prefix and the job's stored tube or the caller's
-- arguments.
--
-- A job is a 12-hex-digit key (its server sequence number) with:
--   P.."jobs"   hash  key -> cmsgpack array (fields below, body last)
--   P.."names"  hash  client id -> key (only for client-chosen ids)
-- and one index entry for its state:
--   ready    P.."ready:"..tube    zset  score priority, member key
--   delayed  P.."bucket:"..tube..":"..second  set  the jobs due in that
--            second, each as the integer key * 1000 + the due time's ms
--            (small sets of integers, which Redis stores compactly)
--            P.."delayed:"..tube  zset  the tube's non-empty buckets, by second
--            P.."soon:"..tube     zset  score due (ms), member key: the jobs
--            of the buckets whose second has begun, which the timer opened
--            P.."due"             zset  tube -> earliest due time (may lag)
--   reserved P.."reserved"        zset  score deadline (ms), member key; the
--            holder is the job's OWNER field (each delayq process knows which
--            jobs its own connections hold)
--   buried   P.."buried:"..tube   zset  score burial sequence, member key
--
-- Each delayq process is a member of P.."processes"; P.."alive:"..process
-- expires unless the process's timer renews it (see `tick`).

-- How long a process counts as alive after its last tick, in ms.
local ALIVE_MS = 3000

-- How long a shard of a cluster keeps the counts of a tube it no longer
-- holds jobs of, in ms.
local COUNTS_KEPT_MS = 86400000
-- How long after a unique window ends its client id may stay in `taken`:
-- the timer frees the ids whose windows ended together, once a second at
-- most (a put checks the window's end itself, so only memory waits).
local TAKEN_SLACK_MS = 1000

-- The key prefix of the current call.
local P

-- Whether this call runs on one shard of a cluster (the caller says). A
-- shard is ticked by one process, and any process may be waiting for its
-- jobs, so its news goes out on the shard's own channel by SPUBLISH, which
-- stays inside the shard's slot, whether or not another process listens.

local SHARDED = false
-- Whether this call runs on the control slot of a cluster, which keeps the
-- tubes' users and pauses, and the time each tube was first seen.
local CONTROL = false

-- The operations this script can run, by name.
local OPS = {}

-- Job fields (indexes into the cmsgpack array).
local STATE, PRI, DELAY, TTR, CREATED, AT, OWNER, TUBE, NAME = 1, 2, 3, 4, 5, 6, 7, 8, 9
local RESERVES, TIMEOUTS, RELEASES, BURIES, KICKS, BODY = 10, 11, 12, 13, 14, 15
-- A job put with options (or into a tube with settings) has three more:
-- its options, its reserves when its round of tries began, and 1 if it is
-- buried for having used up its tries (else 0). Other jobs end at BODY, as
-- jobs written before options existed do.
local OPTIONS, ROUND, DEAD = 16, 17, 18
-- And one with a time to live that ran out while a worker held it gets a
-- fourth, 1: it goes when the worker lets go of it.
local EXPIRED = 19
-- URGENT and MAX_OPTION_MS, the rules' constants, are defined ahead of this file from delayq's
-- own `src/rules.rs` (see `library.rs`), so it is written down once.

-- What follows is the state of one call. A call runs atomically, so every
-- operation in it (a whole batch of them) sees one instant, and work they
-- share is done once: counters are summed and written at the end, tubes are
-- announced once, and the checks for tubes left unused run once at the end.

-- The call's instant in ms: `clock` rounded down, `clock_up` rounded up;
-- `clock_us` in microseconds.
local clock, clock_up, clock_us
local function read_clock()
  local t = redis.call('TIME')
  clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  clock, clock_up = math.floor(clock_us / 1000), math.ceil(clock_us / 1000)
end

local function now_ms()
  if clock == nil then read_clock() end
  return clock
end

-- The next place in an order kept by the sequence `name` (tubes by their
-- creation, burials): on one Redis the sequence counts up; on a cluster
-- each shard keeps its own list, and the lists are merged by Redis time,
-- to the microsecond, so the call's time is the place.
local function next_in_order(name)
  if SHARDED then
    if clock_us == nil then read_clock() end
    return clock_us
  end
  return redis.call('INCR', P .. name)
end

-- The time `ms` from now, rounded up to the millisecond: a job due then is
-- never handed out early, nor a TTR or a pause over early.
local function from_now(ms)
  if clock == nil then read_clock() end
  return clock_up + ms
end

local pending = {}
local function count(key, field, by)
  local fields = pending[key]
  if fields == nil then
    fields = {}
    pending[key] = fields
  end
  fields[field] = (fields[field] or 0) + by
end

-- Job keys for this call's puts, taken from P.."seq" in one step: `PUTS`
-- (the caller says) is how many the call may need; those left unused (a
-- client id that existed) are handed back at the end, which is safe because
-- nothing else runs in between.
local PUTS = 0
local seq_next, seq_last
local function next_key()
  if seq_next == nil then
    seq_last = redis.call('INCRBY', P .. 'seq', math.max(PUTS, 1))
    seq_next = seq_last - math.max(PUTS, 1) + 1
  elseif seq_next > seq_last then
    seq_last = redis.call('INCR', P .. 'seq')
    seq_next = seq_last
  end
  local key = string.format('%012x', seq_next)
  seq_next = seq_next + 1
  return key
end

-- The key an imported job gets: `key` (a number; 0 for none wanted) if no
-- put of this store can have handed it out, else the next of the sequence;
-- either way the sequence ends up past it, so no put hands it out. Every
-- key up to P.."seq" may have been handed out by a put, except those that
-- imports skipped over when they raised the sequence: P.."import-floor"
-- is the sequence as puts last left it (raised whenever the sequence has
-- moved beyond P.."imported", the highest key an import took). A key above
-- the floor is free unless a job holds it, which the caller looks at.
local function claim(key)
  local seq = tonumber(redis.call('GET', P .. 'seq') or '0')
  local imported = tonumber(redis.call('GET', P .. 'imported') or '0')
  local floor = tonumber(redis.call('GET', P .. 'import-floor') or '0')
  if seq > imported and seq > floor then
    floor = seq
    redis.call('SET', P .. 'import-floor', floor)
  end
  if key <= floor then key = math.max(seq, imported) + 1 end
  if key > imported then redis.call('SET', P .. 'imported', key) end
  if key > seq then redis.call('SET', P .. 'seq', key) end
  return key
end

local function tube_key(kind, tube) return P .. kind .. ':' .. tube end

local function load(key)
  local raw = redis.call('HGET', P .. 'jobs', key)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save(key, job) redis.call('HSET', P .. 'jobs', key, cmsgpack.pack(job)) end

-- The key and the job a caller's id names: "#" and the job's key for a
-- server id (delayq writes it so; no client-chosen id has a "#"), else a
-- client-chosen id. A server id never names a job that has a name.
local function key_of(id)
  if string.byte(id) == 35 then
    local key = string.sub(id, 2)
    local job = load(key)
    if job == nil or job[NAME] ~= '' then return nil end
    return key, job
  end
  local key = redis.call('HGET', P .. 'names', id)
  if not key then return nil end
  return key, load(key)
end

-- A job's id as a caller gets it: its client-chosen name, or its server id
-- as a number.
local function id_of(key, job)
  if job[NAME] ~= '' then return job[NAME] end
  return tonumber(key, 16)
end

-- Whether other delayq processes share this Redis and so must hear of what
-- this call did; asked once per call. A process that joins registers
-- before it takes connections, so no waiting worker of its misses a word.
-- None registered means Redis lost its data (a restart without
-- persistence, a FLUSHALL): until the processes beat again, anyone may be
-- waiting.
local shared
local function others()
  if shared == nil then shared = redis.call('SCARD', P .. 'processes') ~= 1 end
  return shared
end

local function tell(message)
  if SHARDED then
    redis.call('SPUBLISH', P .. 'events', message)
  elseif others() then
    redis.call('PUBLISH', P .. 'events', message)
  end
end

-- A due time `at` (ms) was created in a shard: the process that ticks the
-- shard hears of it if it is earlier than the shard's wake time, which that
-- process's tick sets to the earliest thing it found pending.
local function wake_by(at)
  local wake = tonumber(redis.call('GET', P .. 'wake') or -1)
  if wake < 0 or at < wake then
    redis.call('SET', P .. 'wake', at)
    redis.call('SPUBLISH', P .. 'events', 'due:' .. math.max(at - now_ms(), 0))
  end
end

-- Tubes that got ready jobs during this call, each announced once on
-- P.."events" so that every other delayq process serves its waiting
-- connections.
local announced = {}
local function announce(tube)
  if not announced[tube] then
    announced[tube] = true
    -- A shard announces its tubes when the call ends, with their first
    -- ready job (see `finish`).
    if not SHARDED then tell(tube) end
  end
end

-- Tubes whose ready jobs changed in this call (on a shard of a cluster):
-- their first ready job goes back with the call's reply.
local touched = {}

local known = {}
local function ensure_tube(tube)
  if known[tube] then return end
  if not redis.call('ZSCORE', P .. 'tubes', tube) then
    redis.call('ZADD', P .. 'tubes', next_in_order('tube-seq'), tube)
    if SHARDED and not CONTROL then
      redis.call('PERSIST', tube_key('tube', tube))
      redis.call('ZREM', P .. 'dormant', tube)
    end
  end
  known[tube] = true
end

-- When each tube's pause ends (0: not paused), read once per call.
local pause_until = {}
local function paused(tube)
  local at = pause_until[tube]
  if at == nil then
    at = tonumber(redis.call('HGET', tube_key('tube', tube), 'until') or 0)
    pause_until[tube] = at
  end
  return at > now_ms()
end

-- Marks `process` alive (once per call).
local beat = false
local function alive(process)
  if beat then return end
  beat = true
  redis.call('SET', P .. 'alive:' .. process, 1, 'PX', ALIVE_MS)
  redis.call('SADD', P .. 'processes', process)
end

-- Connections using and watching a tube, summed over the delayq processes
-- not taken for dead. Each process counts its own in P.."refs:"..process
-- (fields "u:"..tube and "w:"..tube) and keeps P.."alive:"..process from
-- expiring while it runs; a heartbeat takes it out of P.."processes" once
-- that mark has been missing for a while (see `tick`), so the users of a
-- process that died stop counting then. Not sooner: a process whose mark
-- expired may only be frozen (or Redis was, and every mark expired), and
-- a tube it still watches must not go, its pause with it.
local function tube_users(tube)
  local using, watching = 0, 0
  for _, process in ipairs(redis.call('SMEMBERS', P .. 'processes')) do
    local r = redis.call('HMGET', P .. 'refs:' .. process, 'u:' .. tube, 'w:' .. tube)
    using, watching = using + tonumber(r[1] or 0), watching + tonumber(r[2] or 0)
  end
  return using, watching
end

-- The versions of a process's counts, in P.."refv:"..process (a sorted
-- set): each count's ("u:"..tube or "w:"..tube) as Redis has it, and '#'
-- for the last time the process sent them all. A count comes with the
-- version the process gave it as its call was written (microseconds of its
-- clock, never going back); the cluster client sends a call answered
-- CLUSTERDOWN or TRYAGAIN again after a random wait, so a count may come
-- after a later one, and is then ignored. Versions are kept VERSIONS_KEPT
-- behind the latest: a call sent again comes within the 2 s delayq lets a
-- call take.
local VERSIONS_KEPT = 10000000

-- Whether a count of `name` with version `version` (as its argument came)
-- is the latest Redis has been sent; if so, it is noted as such.
local function latest_ref(process, name, version)
  local versions = P .. 'refv:' .. process
  local seen = redis.call('ZMSCORE', versions, name, '#')
  local v = tonumber(version)
  if v <= (tonumber(seen[1]) or 0) or v <= (tonumber(seen[2]) or 0) then
    return false
  end
  -- The argument, not `v`: Redis writes a Lua number with 14 digits, and a
  -- version has 16.
  redis.call('ZADD', versions, version, name)
  redis.call('ZREMRANGEBYSCORE', versions, '-inf',
    string.format('(%.0f', v - VERSIONS_KEPT))
  return true
end

-- Tubes that may have been left with no jobs and no users; `finish` checks
-- them once the call's counters are written.
local unused = {}
local function maybe_unused(tube)
  if tube ~= 'default' then unused[tube] = true end
end

-- A tube exists while it is used, watched or holds jobs; "default" always.
local function forget_if_unused(tube)
  local t = tube_key('tube', tube)
  local c = redis.call('HMGET', t, 'reserved', 'delayed')
  if tonumber(c[1] or 0) > 0 or tonumber(c[2] or 0) > 0 then return end
  if redis.call('ZCARD', tube_key('ready', tube)) > 0
    or redis.call('ZCARD', tube_key('buried', tube)) > 0 then
    return
  end
  local using, watching = tube_users(tube)
  if using > 0 or watching > 0 then return end
  if CONTROL then
    -- The tube may live on in the shards, by its jobs: the time it was
    -- first seen stays, so it keeps its place in `list-tubes`, until a
    -- process finds it nowhere (`forget_births`). So does its pause, which
    -- holds those jobs back (the timer ends it when due): its figures are
    -- kept at least as long.
    local until_ms = tonumber(redis.call('ZSCORE', P .. 'pauses', tube) or '0')
    redis.call('PEXPIRE', t, math.max(until_ms - now_ms(), 0) + COUNTS_KEPT_MS)
    return
  end
  if SHARDED then
    -- On a cluster a tube's figures are summed over the shards, and a
    -- shard that ran out of its jobs keeps its counts a while, in case
    -- the tube lives on elsewhere (see `stats_tube`), and names it among
    -- its dormant tubes, so that `list-tubes` can tell when it is gone from
    -- every shard and have its counts forgotten (a tube made anew counts
    -- from zero).
    redis.call('PEXPIRE', t, COUNTS_KEPT_MS)
    redis.call('ZADD', P .. 'dormant', 0, tube)
  else
    redis.call('DEL', t)
  end
  redis.call('ZREM', P .. 'tubes', tube)
  redis.call('ZREM', P .. 'pauses', tube)
  redis.call('ZREM', P .. 'due', tube)
end

-- On a shard of a cluster: the first ready job (priority, key) of each
-- tube whose ready jobs changed, as {time, tube, pri, key, ...} (pri -1:
-- none), stamped with the call's time so a process can tell newer news
-- from older. Processes choose among shards by these, so a reserve over
-- many shards still takes the most urgent, oldest job. Tubes that got
-- ready jobs are announced with theirs.
local function heads()
  if clock_us == nil then read_clock() end
  local out = { clock_us }
  for tube in pairs(touched) do
    local first = redis.call('ZRANGE', tube_key('ready', tube), 0, 0, 'WITHSCORES')
    local pri, key = -1, ''
    if first[1] then pri, key = tonumber(first[2]), first[1] end
    out[#out + 1], out[#out + 2], out[#out + 3] = tube, pri, key
    if announced[tube] and pri >= 0 then
      tell(string.format('h %d %s %d %s', clock_us, tube, pri, key))
    end
  end
  touched = {}
  return out
end

-- Writes the counts the call has summed so far. A call sums its changes
-- to each count and writes them at its end (a batch of puts costs one
-- HINCRBY a count, not one a put), but an operation that reads counts
-- writes them first: behind puts or a tick in the same call it would find
-- their jobs in their new states' indexes and not yet in the counts (a
-- `stats` once answered 38,000 ready jobs, 37,752 of them urgent, and
-- 2,248 delayed, of 40,000 in all).
local function write_counts()
  for key, fields in pairs(pending) do
    for field, by in pairs(fields) do
      if by ~= 0 then redis.call('HINCRBY', key, field, by) end
    end
  end
  pending = {}
end

-- The end of every call: write the summed counters, forget the tubes left
-- unused, hand back unused job keys.
local function finish()
  write_counts()
  for tube in pairs(unused) do forget_if_unused(tube) end
  unused = {}
  if seq_next ~= nil and seq_next <= seq_last then
    redis.call('DECRBY', P .. 'seq', seq_last - seq_next + 1)
  end
  if SHARDED then return heads() end
end

-- A delay bucket is opened (its jobs moved into the tube's `soon` set,
-- ordered to the millisecond) this many seconds before its second begins,
-- so that the work of opening a full one is done while its jobs are not yet
-- due, a few at a time between other calls, and never holds up a job that
-- is. A job put after its bucket's opening time goes straight into `soon`.
local OPEN_AHEAD = 1

-- The bucket of a job due at `due` ms, and its second.
local function bucket_of(tube, due)
  local second = math.floor(due / 1000)
  return P .. 'bucket:' .. tube .. ':' .. second, second
end

-- A delayed job's bucket member: its key and the ms of its due time.
-- Written and read as text: the product is past 2^53 for keys from about
-- 9e12, where Lua's numbers (doubles) would round it onto another job's.
local function bucket_member(key, due)
  return string.format('%d%03d', tonumber(key, 16), due % 1000)
end

-- A member of the bucket of `second` read back: the job's due time and key.
local function bucket_entry(second, m)
  return second * 1000 + tonumber(string.sub(m, -3)), string.format('%012x', tonumber(string.sub(m, 1, -4)))
end

-- The jobs of one bucket as {due, key}, soonest first (then oldest).
local function bucket_jobs(tube, second, members)
  members = members or redis.call('SMEMBERS', P .. 'bucket:' .. tube .. ':' .. second)
  local jobs = {}
  for _, m in ipairs(members) do
    local due, key = bucket_entry(second, m)
    jobs[#jobs + 1] = { due, key }
  end
  table.sort(jobs, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  return jobs
end

-- The delayed jobs of a tube, soonest first, at most `limit` of them. Jobs
-- sit in the `soon` set (buckets the timer has opened) or still in their
-- buckets; a job put after the timer opened a bucket can be due before
-- jobs of the `soon` set, so the two are merged by due time.
local function first_delayed(tube, limit)
  local out = {}
  local soon = redis.call('ZRANGE', tube_key('soon', tube), 0, limit - 1, 'WITHSCORES')
  for i = 1, #soon, 2 do out[#out + 1] = { tonumber(soon[i + 1]), soon[i], #out } end
  local taken = 0
  for _, second in ipairs(redis.call('ZRANGE', tube_key('delayed', tube), 0, limit - 1)) do
    if taken >= limit then break end
    for _, j in ipairs(bucket_jobs(tube, tonumber(second))) do
      if taken >= limit then break end
      out[#out + 1] = { j[1], j[2], #out }
      taken = taken + 1
    end
  end
  -- The third field keeps equal due times in the order found (table.sort
  -- is not stable).
  table.sort(out, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[3] < b[3]
  end)
  for i = #out, limit + 1, -1 do out[i] = nil end
  return out
end

-- Takes a job out of the index of its current state. `popped`: the caller
-- already removed it from its ready set.
local function unlink(key, job, popped)
  local tube, state = job[TUBE], job[STATE]
  if state == 'ready' then
    if not popped then redis.call('ZREM', tube_key('ready', tube), key) end
    touched[tube] = true
    if job[PRI] < URGENT then count(tube_key('tube', tube), 'urgent', -1) end
  elseif state == 'delayed' then
    -- P.."due" may now point earlier than the tube's first job: the timer
    -- then finds nothing due there and moves the entry on.
    local bucket, second = bucket_of(tube, job[AT])
    if redis.call('SREM', bucket, bucket_member(key, job[AT])) == 1 then
      if redis.call('EXISTS', bucket) == 0 then redis.call('ZREM', tube_key('delayed', tube), second) end
    else
      redis.call('ZREM', tube_key('soon', tube), key)
    end
    count(tube_key('tube', tube), 'delayed', -1)
  elseif state == 'reserved' then
    redis.call('ZREM', P .. 'reserved', key)
    count(tube_key('tube', tube), 'reserved', -1)
  elseif state == 'buried' then
    redis.call('ZREM', tube_key('buried', tube), key)
  end
end

-- Puts an unlinked job into `state` (with its due time, deadline or burial
-- sequence `at`) and saves it.
local function link(key, job, state, at)
  local tube = job[TUBE]
  job[STATE], job[AT] = state, at
  if state == 'ready' then
    redis.call('ZADD', tube_key('ready', tube), job[PRI], key)
    touched[tube] = true
    if job[PRI] < URGENT then count(tube_key('tube', tube), 'urgent', 1) end
    announce(tube)
  elseif state == 'delayed' then
    local bucket, second = bucket_of(tube, at)
    if second - OPEN_AHEAD <= math.floor(now_ms() / 1000) then
      -- Its bucket's time to be opened has come: straight into `soon`,
      -- rather than into a bucket the timer would have to open again.
      redis.call('ZADD', tube_key('soon', tube), at, key)
    else
      redis.call('SADD', bucket, bucket_member(key, at))
      redis.call('ZADD', tube_key('delayed', tube), second, second)
    end
    if redis.call('ZADD', P .. 'due', 'LT', 'CH', at, tube) == 1 then
      -- An earlier due time than the timers knew of: tell every process
      -- how long from now (no tube name contains ':').
      if SHARDED then wake_by(at) elseif others() then tell('due:' .. math.max(at - now_ms(), 0)) end
    end
    count(tube_key('tube', tube), 'delayed', 1)
  elseif state == 'reserved' then
    redis.call('ZADD', P .. 'reserved', at, key)
    count(tube_key('tube', tube), 'reserved', 1)
    -- On one Redis every process ticks the one key space; a shard is
    -- ticked by one process only, which must hear of the new deadline.
    if SHARDED then wake_by(at) end
  elseif state == 'buried' then
    redis.call('ZADD', tube_key('buried', tube), at, key)
  end
  save(key, job)
end

-- The job as handed to a client: id, tube, body.
local function body_of(key, job)
  return { id_of(key, job), job[TUBE], job[BODY] }
end

local function reserve_key(key, job, owner, popped)
  unlink(key, job, popped)
  job[RESERVES] = job[RESERVES] + 1
  job[OWNER] = owner
  link(key, job, 'reserved', from_now(job[TTR]))
  local out = body_of(key, job)
  out[4] = job[TTR]
  return out
end

-- Options, as delayq writes them: 'tries|kind|base|max|jitter|ttl|unique|
-- rate', each field empty when unset (kind 'f' fixed or 'e' exponential
-- backoff, times in ms); '' when none is set.
local function split_options(s)
  return { string.match(s, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$') }
end

-- A tube's settings (read once per call).
local settings = {}
local function settings_of(tube)
  local s = settings[tube]
  if s == nil then
    s = redis.call('HGET', P .. 'settings', tube) or ''
    settings[tube] = s
  end
  return s
end

-- A put's options, each unset one taken from the tube's settings.
local function with_settings(options, tube)
  local s = settings_of(tube)
  if s == '' then return options end
  local fallback = split_options(s)
  local own = options == '' and { '', '', '', '', '', '', '', '' } or split_options(options)
  local any = false
  -- Not the tube's rate (the 8th): a job has none of its own, so a tube
  -- with only a rate gives its jobs no options at all.
  for i = 1, 7 do
    if own[i] == '' then own[i] = fallback[i] end
    any = any or own[i] ~= ''
  end
  if not any then return '' end
  own[8] = ''
  return table.concat(own, '|')
end

-- A tube's rate limit, in reserves a second, if it has one.
local function rate_of(tube)
  local s = settings_of(tube)
  if s == '' then return nil end
  return tonumber(split_options(s)[8])
end

local function rate_key(tube, second) return tube_key('rate', tube) .. ':' .. second end

-- Whether `tube` has had all the reserves its rate allows this second; if
-- so, the timer serves its waiting workers when the next one begins.
local function rate_used_up(tube)
  local rate = rate_of(tube)
  if rate == nil then return false end
  local second = math.floor(now_ms() / 1000)
  if tonumber(redis.call('GET', rate_key(tube, second)) or 0) < rate then return false end
  local at = (second + 1) * 1000
  redis.call('ZADD', P .. 'limited', at, tube)
  if SHARDED then wake_by(at) end
  return true
end

-- Counts a reserve from `tube`, for its rate.
local function count_reserve(tube)
  if rate_of(tube) == nil then return end
  local key = rate_key(tube, math.floor(now_ms() / 1000))
  redis.call('INCR', key)
  redis.call('PEXPIRE', key, 2000)
end

-- Reserves in the job's round.
local function tries_of(job) return job[RESERVES] - (job[ROUND] or 0) end

-- Whether the job has used up the tries its options allow.
local function out_of_tries(job)
  if not job[OPTIONS] then return false end
  local tries = tonumber(split_options(job[OPTIONS])[1])
  return tries ~= nil and tries_of(job) >= tries
end

-- The wait in ms before a job that came back is ready again: as
-- `backoff_wait` in src/rules.rs computes it, to the millisecond (every
-- number stays an integer below 2^53, which a Lua number holds exactly).
local function backoff_of(key, job)
  if not job[OPTIONS] then return 0 end
  local o = split_options(job[OPTIONS])
  local base = tonumber(o[3])
  if base == nil then return 0 end
  local n = tries_of(job)
  local ms = base
  if o[2] == 'e' then ms = base * 2 ^ math.min(math.max(n - 1, 0), 40) end
  ms = math.min(ms, tonumber(o[4]) or MAX_OPTION_MS)
  local jitter = tonumber(o[5]) or 0
  local per_mille = ((tonumber(key, 16) % 1000003) * 7919 + n * 104729) % 1000
  return ms - math.floor(ms * jitter * per_mille / 100000)
end

-- Buries a job that used up its tries (a dead letter).
local function bury_dead(key, job)
  job[BURIES], job[DEAD] = job[BURIES] + 1, 1
  link(key, job, 'buried', next_in_order('bury-seq'))
end

-- A job whose TTR ran out or that was released with no delay of its own:
-- buried if it used up its tries, else delayed by its backoff, else ready.
-- Returns the wait, -1 if buried.
local function come_back(key, job)
  if out_of_tries(job) then
    bury_dead(key, job)
    return -1
  end
  local wait = backoff_of(key, job)
  if wait > 0 then
    job[DELAY] = wait
    link(key, job, 'delayed', from_now(wait))
  else
    link(key, job, 'ready', 0)
  end
  return wait
end

-- Removes a job for good: out of its state's index, the pool, the names
-- and the expiries. `gone_at`: when it went, if before now (a time to live
-- that ran out while nothing ticked), which its unique window counts from.
local function drop(key, job, gone_at)
  unlink(key, job)
  redis.call('HDEL', P .. 'jobs', key)
  if job[NAME] ~= '' then redis.call('HDEL', P .. 'names', job[NAME]) end
  if job[OPTIONS] then
    redis.call('ZREM', P .. 'expiries', key)
    local window = tonumber(split_options(job[OPTIONS])[7])
    if window ~= nil and job[NAME] ~= '' then
      -- Its unique window: the client id stays taken until it ends.
      local ends = gone_at and gone_at + window or from_now(window)
      redis.call('ZADD', P .. 'taken', ends, job[NAME])
      -- A shard is ticked only when something in it falls due: this does,
      -- to free the id.
      if SHARDED then wake_by(ends + TAKEN_SLACK_MS) end
    end
  end
  maybe_unused(job[TUBE])
end

-- Whether a client id is taken: by a job, or by a gone job's unique window.
local function name_taken(name)
  if redis.call('HEXISTS', P .. 'names', name) == 1 then return true end
  local ends = redis.call('ZSCORE', P .. 'taken', name)
  return ends ~= false and tonumber(ends) > now_ms()
end

-- Removes a job whose time to live ran out, and counts it.
local function expire(key, job, gone_at)
  drop(key, job, gone_at)
  count(tube_key('tube', job[TUBE]), 'expired', 1)
  count(P .. 'totals', 'expired', 1)
end

-- Whether a job a worker lets go of had its time to live run out while
-- it was held; if so it is removed.
local function gone_if_expired(key, job)
  if job[EXPIRED] ~= 1 then return false end
  expire(key, job)
  return true
end

-- Notes when a job put now expires, if it has a time to live.
local function expires(key, job)
  if not job[OPTIONS] then return end
  local ttl = tonumber(split_options(job[OPTIONS])[6])
  if ttl == nil then return end
  local at = job[CREATED] + ttl
  redis.call('ZADD', P .. 'expiries', at, key)
  if SHARDED then wake_by(at) elseif others() then tell('due:' .. ttl) end
end

-- A job kicked out of buried starts a fresh round of tries.
local function new_round(job)
  if job[STATE] == 'buried' and job[OPTIONS] then
    job[ROUND], job[DEAD] = job[RESERVES], 0
  end
end

local function is_held(job, owner) return job[STATE] == 'reserved' and job[OWNER] == owner end

-- Starts a call: a library's locals outlive calls, so every piece of
-- per-call state is reset here.
local function begin(prefix, puts, sharded, control)
  P, PUTS, SHARDED, CONTROL = prefix, puts or 0, sharded, control
  clock, clock_up, clock_us, pending, seq_next, seq_last, shared = nil, nil, nil, {}, nil, nil, nil
  announced, known, pause_until, beat, unused, touched = {}, {}, {}, false, {}, {}
  settings = {}
end
