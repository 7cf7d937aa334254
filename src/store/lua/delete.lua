-- delete / finish: remove a job. `delete` takes any job not reserved by
-- another connection; `finish` only one reserved by this one.
-- Args: owner, id, 'delete' | 'finish'
-- Returns 1 if deleted, 0 if not found.
OPS.delete = function(owner, id, mode)
  local key, job = key_of(id)
  if key == nil then return 0 end
  if mode == 'finish' and not is_held(job, owner) then return 0 end
  if job[STATE] == 'reserved' and job[OWNER] ~= owner then return 0 end
  drop(key, job)
  count(tube_key('tube', job[TUBE]), 'cmd-delete', 1)
  return 1
end
