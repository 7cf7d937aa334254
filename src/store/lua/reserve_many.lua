-- reserve-many: take up to `count` jobs at once, each as `reserve` would,
-- in the order it would take them one by one.
-- Args: owner, the tubes separated by spaces, count
-- Returns a list of {id, tube, body, ttr}, possibly empty.
OPS.reserve_many = function(owner, tubes, count)
  local out = {}
  for _ = 1, tonumber(count) do
    local got = OPS.reserve(owner, tubes)
    if not got then break end
    out[#out + 1] = got
  end
  return out
end
