-- reserve-job: reserve one job by id if it is ready, delayed or buried.
-- Args: owner, id
-- Returns {id, tube, body, ttr} or false.
OPS.reserve_job = function(owner, id)
  local key, job = key_of(id)
  if key == nil or job[STATE] == 'reserved' then return false end
  return reserve_key(key, job, owner, false)
end
