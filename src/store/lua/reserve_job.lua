-- reserve-job: reserve one job by id if it is ready, delayed or buried.
-- ARGV: prefix, owner, id
-- Returns {id, tube, body, ttr} or false.
local key, job = key_of(ARGV[3])
if key == nil or job[STATE] == 'reserved' then return false end
return reserve_key(key, job, ARGV[2], now_ms())
