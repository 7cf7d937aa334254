-- release: put a job this connection holds back, ready or delayed.
-- ARGV: prefix, owner, id, pri, delay ms
-- Returns the job's tube, or false if not held.
local key, job = key_of(ARGV[3])
if key == nil or not is_held(job, ARGV[2]) then return false end
local delay = tonumber(ARGV[5])
unlink(key, job)
job[PRI], job[DELAY], job[OWNER] = tonumber(ARGV[4]), delay, ''
job[RELEASES] = job[RELEASES] + 1
if delay > 0 then
  link(key, job, 'delayed', now_ms() + delay)
else
  link(key, job, 'ready', 0)
end
return job[TUBE]
