-- ids: a block of `n` job keys from the cluster-wide sequence, for one
-- process to hand out (kept in the control slot).
-- Args: n
-- Returns the last key of the block (the block ends there).
OPS.ids = function(n)
  return redis.call('INCRBY', P .. 'seq', tonumber(n))
end
