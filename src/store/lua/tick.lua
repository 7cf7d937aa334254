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
for _, tube in ipairs(due) do
  local bucket = tube_key('delayed', tube)
  local keys = redis.call('ZRANGEBYSCORE', bucket, '-inf', now, 'LIMIT', 0, budget)
  for _, key in ipairs(keys) do
    local job = load(key)
    unlink(key, job)
    link(key, job, 'ready', 0)
  end
  budget = budget - #keys
  local first = redis.call('ZRANGE', bucket, 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', P .. 'due', first[2], tube)
  else
    redis.call('ZREM', P .. 'due', tube)
  end
  if budget <= 0 then return done(0) end
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
