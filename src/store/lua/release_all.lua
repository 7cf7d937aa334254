-- release all: a connection closed; the jobs it held go back to ready.
-- Args: owner, ids separated by spaces (the jobs the connection believes
-- it holds; those it no longer does, because their TTR ran out, are left
-- alone), '1' if the worker failed them (its connection closed while the
-- server runs): a job with tries or a backoff then comes back as after
-- its TTR ran out (buried once its tries are used up, else delayed by its
-- backoff), so that a job that crashes its worker ends a dead letter.
-- Otherwise (the server stops, or a reserve took the job for a client
-- that had gone) the job goes back unfailed, and the try its reserve
-- counted is given back with it: else a job on its last try would be
-- reserved once more than its tries allow.
-- Returns the tubes that got jobs back ready.
OPS.release_all = function(owner, ids, failed)
  local tubes = {}
  for id in string.gmatch(ids, '[^ ]+') do
    local key, job = key_of(id)
    if key ~= nil and is_held(job, owner) and not gone_if_expired(key, job) then
      unlink(key, job)
      job[OWNER] = ''
      local wait = 0
      if failed == '1' and job[OPTIONS] then
        wait = come_back(key, job)
      else
        if failed ~= '1' and job[OPTIONS] and tries_of(job) > 0 then
          job[ROUND] = (job[ROUND] or 0) + 1
        end
        link(key, job, 'ready', 0)
      end
      if wait == 0 then tubes[#tubes + 1] = job[TUBE] end
    end
  end
  return tubes
end
