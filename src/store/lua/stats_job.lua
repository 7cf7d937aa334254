-- stats-job: a job's figures.
-- Args: id
-- Returns {id, tube, state, pri, age, delay, ttr, time-left (all ms),
--          reserves, timeouts, releases, buries, kicks[, options, tries,
--          dead]} or false; the last three for a job with options.
OPS.stats_job = function(id)
  local key, job = key_of(id)
  if key == nil then return false end
  local now = now_ms()
  local left = 0
  -- Counted from the instant rounded up, as due times are: a time just set
  -- shows no more than it was set to.
  if job[STATE] == 'delayed' or job[STATE] == 'reserved' then left = math.max(job[AT] - from_now(0), 0) end
  local out = { id_of(key, job), job[TUBE], job[STATE], job[PRI], now - job[CREATED], job[DELAY], job[TTR],
    left, job[RESERVES], job[TIMEOUTS], job[RELEASES], job[BURIES], job[KICKS] }
  if job[OPTIONS] then
    out[14], out[15], out[16] = job[OPTIONS], tries_of(job), job[DEAD]
  end
  return out
end
