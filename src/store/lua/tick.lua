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
  local buckets = tube_key('delayed', tube)
  for _, second in ipairs(redis.call('ZRANGEBYSCORE', buckets, '-inf', this_second, 'LIMIT', 0, budget)) do
    second = tonumber(second)
    local members = nil
    if second < this_second then
      -- Every job of a past second is due: take any, up to the budget.
      members = redis.call('SRANDMEMBER', P .. 'bucket:' .. tube .. ':' .. second, budget)
    end
    for _, j in ipairs(bucket_jobs(tube, second, members)) do
      if j[1] > now or budget <= 0 then break end
      local job = load(j[2])
      unlink(j[2], job)
      link(j[2], job, 'ready', 0)
      budget = budget - 1
    end
    if budget <= 0 then break end
  end
  local first = redis.call('ZRANGE', buckets, 0, 0)[1]
  if first == nil then
    redis.call('ZREM', P .. 'due', tube)
  elseif tonumber(first) < this_second then
    redis.call('ZADD', P .. 'due', now, tube)
  else
    redis.call('ZADD', P .. 'due', bucket_jobs(tube, tonumber(first))[1][1], tube)
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
