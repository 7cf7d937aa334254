-- export: whole jobs, a page at a time, by HSCAN of the job hash (a job
-- that lives through a whole scan is in at least one page).
-- Args: cursor, count
-- Returns {next cursor, {id, tube, state, pri, when it was put (ms since
--          the epoch), delay, ttr, time left,
--          burial order, reserves, timeouts, releases, buries, kicks,
--          options, tries, dead, body}...} (times in ms; options '' for
--          none).
OPS.export = function(cursor, n)
  local got = redis.call('HSCAN', P .. 'jobs', cursor, 'COUNT', tonumber(n))
  local now = now_ms()
  local out = {}
  local raw = got[2]
  for i = 1, #raw, 2 do
    local key, job = raw[i], cmsgpack.unpack(raw[i + 1])
    local state, left, order = job[STATE], 0, 0
    if state == 'delayed' then
      left = math.max(job[AT] - from_now(0), 0)
    elseif state == 'buried' then
      order = job[AT]
    end
    local tries, dead = 0, 0
    if job[OPTIONS] then tries, dead = tries_of(job), job[DEAD] end
    out[#out + 1] = { id_of(key, job), job[TUBE], state, job[PRI], job[CREATED], job[DELAY],
      job[TTR], left, order, job[RESERVES], job[TIMEOUTS], job[RELEASES], job[BURIES], job[KICKS],
      job[OPTIONS] or '', tries, dead, job[BODY] }
  end
  return { got[1], out }
end
