-- touch: restart the TTR of a job this connection holds.
-- Args: owner, id
-- Returns the TTR in ms, or false if not held.
OPS.touch = function(owner, id)
  local key, job = key_of(id)
  if key == nil or not is_held(job, owner) then return false end
  unlink(key, job)
  link(key, job, 'reserved', from_now(job[TTR]))
  return job[TTR]
end
