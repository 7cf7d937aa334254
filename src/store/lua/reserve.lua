-- reserve: take the most urgent ready job of the unpaused tubes given
-- whose rate limit allows another reserve this second.
-- Args: owner, the tubes separated by spaces (no tube name has one)
-- Returns {id, tube, body, ttr}; or, when it took nothing, 0 if a tube's
-- rate held it back (so that the caller's timer serves the waiting workers
-- as the next second begins: on one Redis nothing else tells it), else
-- false.
OPS.reserve = function(owner, tubes)
  if not string.find(tubes, ' ', 1, true) then
    -- One tube, the usual case: pop its first job in one step.
    local tube = tubes
    if paused(tube) then return false end
    if rate_used_up(tube) then return 0 end
    local key = redis.call('ZPOPMIN', tube_key('ready', tube))[1]
    if key == nil then
      -- So that the caller's process, which looked here because it took
      -- this tube to have a job, learns there is none (another process
      -- took it, which tells nobody): kept, that stale news sent every
      -- later reserve of the process here first, to find nothing again.
      touched[tube] = true
      return false
    end
    count_reserve(tube)
    return reserve_key(key, load(key), owner, true)
  end
  local best_key, best_pri
  local held = false
  for tube in string.gmatch(tubes, '[^ ]+') do
    local limited = not paused(tube) and rate_used_up(tube)
    held = held or limited
    if not paused(tube) and not limited then
      local first = redis.call('ZRANGE', tube_key('ready', tube), 0, 0, 'WITHSCORES')
      if first[1] then
        local pri = tonumber(first[2])
        if best_key == nil or pri < best_pri or (pri == best_pri and first[1] < best_key) then
          best_key, best_pri = first[1], pri
        end
      else
        -- None here, as above.
        touched[tube] = true
      end
    end
  end
  if best_key == nil then return held and 0 or false end
  local job = load(best_key)
  count_reserve(job[TUBE])
  return reserve_key(best_key, job, owner, false)
end
