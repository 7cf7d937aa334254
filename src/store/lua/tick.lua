-- tick: move what has fallen due, at most `batch` jobs per call.
-- Delayed jobs become ready; reserved jobs past their deadline come back
-- (a timeout); paused tubes whose pause ended resume.
-- It also renews this process's alive mark (see `heartbeat`).
-- ARGV: prefix, batch, process
-- Returns {next, tube...}: ms until the next due time (0: call again now;
-- -1: nothing pending), then the tubes that got ready jobs.
local function done(next_ms)
  local out = { next_ms }
  for tube in pairs(announced) do out[#out + 1] = tube end
  return out
end
local now, budget = now_ms(), tonumber(ARGV[2])
heartbeat(ARGV[3])

local due = redis.call('ZRANGEBYSCORE', P .. 'due', '-inf', now, 'LIMIT', 0, budget)
local this_second = math.floor(now / 1000)
for _, tube in ipairs(due) do
  local buckets, soon = tube_key('delayed', tube), tube_key('soon', tube)
  -- Open the buckets whose second has begun: their jobs go into the tube's
  -- `soon` set, ordered to the millisecond, so no tick scans a whole bucket.
  for _, second in ipairs(redis.call('ZRANGEBYSCORE', buckets, '-inf', this_second, 'LIMIT', 0, budget)) do
    second = tonumber(second)
    local bucket = P .. 'bucket:' .. tube .. ':' .. second
    for _, j in ipairs(bucket_jobs(tube, second, redis.call('SPOP', bucket, budget))) do
      redis.call('ZADD', soon, j[1], j[2])
      budget = budget - 1
    end
    if redis.call('EXISTS', bucket) == 1 or budget <= 0 then break end
    redis.call('ZREM', buckets, second)
  end
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', soon, '-inf', now, 'LIMIT', 0, math.max(budget, 0))) do
    local job = load(key)
    unlink(key, job)
    link(key, job, 'ready', 0)
    budget = budget - 1
  end
  if budget <= 0 then
    redis.call('ZADD', P .. 'due', now, tube)
    return done(0)
  end
  local next_due = redis.call('ZRANGE', soon, 0, 0, 'WITHSCORES')[2]
  local next_second = redis.call('ZRANGE', buckets, 0, 0)[1]
  if next_second then
    local at = tonumber(next_second) * 1000
    if next_due == nil or at < tonumber(next_due) then next_due = at end
  end
  if next_due == nil then
    redis.call('ZREM', P .. 'due', tube)
  else
    redis.call('ZADD', P .. 'due', next_due, tube)
  end
end

local expired = redis.call('ZRANGEBYSCORE', P .. 'reserved', '-inf', now, 'LIMIT', 0, budget)
for _, key in ipairs(expired) do
  local job = load(key)
  unlink(key, job)
  job[TIMEOUTS], job[OWNER] = job[TIMEOUTS] + 1, ''
  link(key, job, 'ready', 0)
end
if #expired > 0 then redis.call('HINCRBY', P .. 'totals', 'timeouts', #expired) end
budget = budget - #expired
if budget <= 0 then return done(0) end

for _, tube in ipairs(redis.call('ZRANGEBYSCORE', P .. 'pauses', '-inf', now)) do
  redis.call('ZREM', P .. 'pauses', tube)
  redis.call('HDEL', tube_key('tube', tube), 'pause', 'until')
  announce(tube)
end

local next_at = -1
for _, index in ipairs({ 'due', 'reserved', 'pauses' }) do
  local first = redis.call('ZRANGE', P .. index, 0, 0, 'WITHSCORES')
  if first[2] then
    local at = tonumber(first[2])
    if next_at < 0 or at < next_at then next_at = at end
  end
end
if next_at < 0 then return done(-1) end
return done(math.max(next_at - now, 0))
