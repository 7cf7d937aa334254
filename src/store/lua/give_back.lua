-- give back: undo a reservation whose waiter had gone; back to ready as if
-- it had never been reserved.
-- Args: owner, id
-- Returns the job's tube, or false if the owner does not hold the job.
OPS.give_back = function(owner, id)
  local key, job = key_of(id)
  if key == nil or not is_held(job, owner) then return false end
  if gone_if_expired(key, job) then return job[TUBE] end
  unlink(key, job)
  job[RESERVES] = math.max(job[RESERVES] - 1, 0)
  job[OWNER] = ''
  link(key, job, 'ready', 0)
  return job[TUBE]
end
