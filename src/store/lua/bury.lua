-- bury: set aside a job this connection holds.
-- Args: owner, id, pri
-- Returns 1, or 0 if not held.
OPS.bury = function(owner, id, pri)
  local key, job = key_of(id)
  if key == nil or not is_held(job, owner) then return 0 end
  if gone_if_expired(key, job) then return 1 end
  unlink(key, job)
  job[PRI], job[OWNER] = tonumber(pri), ''
  job[BURIES] = job[BURIES] + 1
  if job[OPTIONS] then job[DEAD] = 0 end
  link(key, job, 'buried', next_in_order('bury-seq'))
  return 1
end
