-- hold_tube: on a shard of a cluster, a tube's pause as the control slot
-- keeps it, so that this shard's reserves keep to it from the moment
-- `pause-tube` answers, whichever process reserves: a process learns of
-- another's pause only at its next tick. The shard's tick lifts the pause
-- when it ends and announces the tube's first ready job, which wakes the
-- workers of every process.
-- Args: tube, when the pause ends in ms of the control slot's clock (0:
-- resumed)
-- Returns 1.
OPS.hold_tube = function(tube, until_ms)
  until_ms = tonumber(until_ms)
  local t = tube_key('tube', tube)
  if until_ms > 0 then
    redis.call('HSET', t, 'until', until_ms)
    redis.call('ZADD', P .. 'pauses', until_ms, tube)
    pause_until[tube] = until_ms
    -- The counts of a tube that left this shard are kept for a while
    -- (`forget_if_unused`); the pause must not go with them before its end.
    local kept, left = redis.call('PTTL', t), until_ms - now_ms()
    if kept > 0 and kept < left then redis.call('PEXPIRE', t, left) end
  else
    redis.call('HDEL', t, 'until')
    redis.call('ZREM', P .. 'pauses', tube)
    pause_until[tube] = 0
    touched[tube] = true
    announce(tube)
  end
  return 1
end
