-- kick-job: move one buried or delayed job to ready.
-- Args: id
-- Returns the job's tube, or false.
OPS.kick_job = function(id)
  local key, job = key_of(id)
  if key == nil or (job[STATE] ~= 'buried' and job[STATE] ~= 'delayed') then return false end
  new_round(job)
  unlink(key, job)
  job[KICKS] = job[KICKS] + 1
  link(key, job, 'ready', 0)
  return job[TUBE]
end
