-- bury: set aside a job this connection holds.
-- ARGV: prefix, owner, id, pri
local key, job = key_of(ARGV[3])
if key == nil or not is_held(job, ARGV[2]) then return 0 end
unlink(key, job)
job[PRI], job[OWNER] = tonumber(ARGV[4]), ''
job[BURIES] = job[BURIES] + 1
link(key, job, 'buried', redis.call('INCR', P .. 'bury-seq'))
return 1
