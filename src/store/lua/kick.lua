-- kick: move up to `bound` buried jobs of a tube to ready, or if it has none
-- (or `kind` says so), delayed ones.
-- Args: tube, bound, kind ('' to choose, 'buried' or 'delayed')
-- Returns {kicked, kind}.
OPS.kick = function(tube, bound, kind)
  bound = tonumber(bound)
  if kind == '' then
    kind = redis.call('ZCARD', tube_key('buried', tube)) > 0 and 'buried' or 'delayed'
  end
  if bound <= 0 then return { 0, kind } end
  local keys
  if kind == 'buried' then
    keys = redis.call('ZRANGE', tube_key('buried', tube), 0, bound - 1)
  else
    keys = {}
    for _, j in ipairs(first_delayed(tube, bound)) do keys[#keys + 1] = j[2] end
  end
  for _, key in ipairs(keys) do
    local job = load(key)
    new_round(job)
    unlink(key, job)
    job[KICKS] = job[KICKS] + 1
    link(key, job, 'ready', 0)
  end
  return { #keys, kind }
end
