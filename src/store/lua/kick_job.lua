-- kick-job: move one buried or delayed job to ready.
-- ARGV: prefix, id
-- Returns the job's tube, or false.
local key, job = key_of(ARGV[2])
if key == nil or (job[STATE] ~= 'buried' and job[STATE] ~= 'delayed') then return false end
unlink(key, job)
job[KICKS] = job[KICKS] + 1
link(key, job, 'ready', 0)
return job[TUBE]
