-- delete-many / finish-many: remove several jobs, each as `delete` (or
-- `finish`) would.
-- Args: owner, ids separated by spaces, 'delete' | 'finish'
-- Returns how many were removed.
OPS.delete_many = function(owner, ids, mode)
  local removed = 0
  for id in string.gmatch(ids, '[^ ]+') do
    removed = removed + OPS.delete(owner, id, mode)
  end
  return removed
end
