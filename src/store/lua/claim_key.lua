-- claim_key: whether an imported server id may be kept on a cluster (see
-- `claim` in the prelude); kept in the control slot with the sequence.
-- Args: key (a number)
-- Returns 1 if it may (and no process will hand it out), 0 if not.
OPS.claim_key = function(key)
  key = tonumber(key)
  if claim(key) == key then return 1 end
  -- The key `claim` took instead is left unused: keys are never reused,
  -- and a gap costs nothing.
  return 0
end
