-- touch: restart the TTR of a job this connection holds.
-- ARGV: prefix, owner, id
-- Returns the TTR in ms, or false if not held.
local key, job = key_of(ARGV[3])
if key == nil or not is_held(job, ARGV[2]) then return false end
unlink(key, job)
link(key, job, 'reserved', now_ms() + job[TTR])
return job[TTR]
