-- release: put a job this connection holds back, ready or delayed (by the
-- delay given, or if none by its backoff), or buried if it used up its
-- tries; removed if its time to live ran out while it was held.
-- Args: owner, id, pri, delay ms
-- Returns {tube, delay ms (-1: buried)}, or false if not held.
OPS.release = function(owner, id, pri, delay)
  local key, job = key_of(id)
  if key == nil or not is_held(job, owner) then return false end
  if gone_if_expired(key, job) then return { job[TUBE], 0 } end
  delay = tonumber(delay)
  unlink(key, job)
  job[PRI], job[OWNER] = tonumber(pri), ''
  if out_of_tries(job) then
    bury_dead(key, job)
    return { job[TUBE], -1 }
  end
  job[DELAY], job[RELEASES] = delay, job[RELEASES] + 1
  if delay > 0 then
    link(key, job, 'delayed', from_now(delay))
    return { job[TUBE], delay }
  end
  return { job[TUBE], come_back(key, job) }
end
