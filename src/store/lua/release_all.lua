-- release all: a connection closed; the jobs it held go back to ready.
-- Args: owner, ids separated by spaces (the jobs the connection believes
-- it holds; those it no longer does, because their TTR ran out, are left
-- alone)
-- Returns the tubes that got jobs back.
OPS.release_all = function(owner, ids)
  local tubes = {}
  for id in string.gmatch(ids, '[^ ]+') do
    local key, job = key_of(id)
    if key ~= nil and is_held(job, owner) and not gone_if_expired(key, job) then
      unlink(key, job)
      job[OWNER] = ''
      link(key, job, 'ready', 0)
      tubes[#tubes + 1] = job[TUBE]
    end
  end
  return tubes
end
