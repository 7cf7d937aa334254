-- put: insert a job, ready or delayed.
-- ARGV: prefix, tube, client id ('' for a server id), pri, delay ms, ttr ms, body
-- Returns {1, id} inserted, or {0, id} when the client id exists already.
local tube, name = ARGV[2], ARGV[3]
local pri, delay, ttr = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if name ~= '' and redis.call('HEXISTS', P .. 'names', name) == 1 then return { 0, name } end
local now = now_ms()
local key = string.format('%012x', redis.call('INCR', P .. 'seq'))
ensure_tube(tube)
count(tube_key('tube', tube), 'total', 1)
count(P .. 'totals', 'jobs', 1)
if name ~= '' then redis.call('HSET', P .. 'names', name, key) end
local job = { '', pri, delay, ttr, now, 0, '', tube, name, 0, 0, 0, 0, 0, ARGV[7] }
if delay > 0 then
  link(key, job, 'delayed', now + delay)
else
  link(key, job, 'ready', 0)
end
return { 1, id_of(key, job) }
