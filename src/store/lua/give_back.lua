-- give back: undo a reservation whose waiter had gone; back to ready as if
-- it had never been reserved.
-- ARGV: prefix, owner, id
local key, job = key_of(ARGV[3])
if key == nil or not is_held(job, ARGV[2]) then return 0 end
unlink(key, job)
job[RESERVES] = math.max(job[RESERVES] - 1, 0)
link(key, job, 'ready', 0)
return 1
