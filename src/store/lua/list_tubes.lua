-- list-tubes: every tube, oldest first.
-- Args: none
-- Returns the tube names.
OPS.list_tubes = function()
  return redis.call('ZRANGE', P .. 'tubes', 0, -1)
end
