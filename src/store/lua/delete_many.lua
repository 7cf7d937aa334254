-- delete-many / finish-many: remove several jobs, each as `delete` (or
-- `finish`) would.
-- Args: owner, ids separated by spaces, 'delete' | 'finish'
-- Returns how many were removed.
OPS.delete_many = function(owner, ids, mode)
  local removed = 0
  -- Server ids of jobs this connection holds, with no options, the usual
  -- end of a batch: read, unindexed and removed in one command each.
  local keys, others, seen = {}, {}, {}
  for id in string.gmatch(ids, '[^ ]+') do
    if string.byte(id) ~= 35 then
      others[#others + 1] = id
    elseif not seen[id] then
      -- Named twice, a job is removed once.
      seen[id] = true
      keys[#keys + 1] = string.sub(id, 2)
    end
  end
  if #keys > 0 then
    local raws = redis.call('HMGET', P .. 'jobs', unpack(keys))
    local gone = {}
    for i, key in ipairs(keys) do
      local job = raws[i] and cmsgpack.unpack(raws[i])
      if job and job[NAME] == '' and not job[OPTIONS] and is_held(job, owner) then
        count(tube_key('tube', job[TUBE]), 'reserved', -1)
        count(tube_key('tube', job[TUBE]), 'cmd-delete', 1)
        maybe_unused(job[TUBE])
        gone[#gone + 1] = key
      elseif job then
        others[#others + 1] = '#' .. key
      end
    end
    if #gone > 0 then
      redis.call('ZREM', P .. 'reserved', unpack(gone))
      redis.call('HDEL', P .. 'jobs', unpack(gone))
      removed = #gone
    end
  end
  for _, id in ipairs(others) do
    removed = removed + OPS.delete(owner, id, mode)
  end
  return removed
end
