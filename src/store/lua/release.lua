-- release: put a job this connection holds back, ready or delayed.
-- Args: owner, id, pri, delay ms
-- Returns the job's tube, or false if not held.
OPS.release = function(owner, id, pri, delay)
  local key, job = key_of(id)
  if key == nil or not is_held(job, owner) then return false end
  delay = tonumber(delay)
  unlink(key, job)
  job[PRI], job[DELAY], job[OWNER] = tonumber(pri), delay, ''
  job[RELEASES] = job[RELEASES] + 1
  if delay > 0 then
    link(key, job, 'delayed', from_now(delay))
  else
    link(key, job, 'ready', 0)
  end
  return job[TUBE]
end
