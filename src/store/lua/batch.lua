-- batch: several transitions from different connections in one call, so
-- that concurrent commands share one round trip and one script invocation,
-- and their counter increments and announcements are written once.
-- ARGV: prefix, then for each transition: its name, its argument count n,
-- and its n arguments (as the transition's own script takes them after the
-- prefix).
-- Returns one {1, result} or {0, error} per transition, in order. A failed
-- transition does not stop the others: they came from other clients.
local out, i = {}, 2
while i <= #ARGV do
  local op, n = OPS[ARGV[i]], tonumber(ARGV[i + 1])
  local args = { P }
  for j = 1, n do args[j + 1] = ARGV[i + 1 + j] end
  i = i + 2 + n
  local ok, result = pcall(op, args)
  if ok then
    out[#out + 1] = { 1, result }
  else
    out[#out + 1] = { 0, type(result) == 'table' and result.err or tostring(result) }
  end
end
flush()
return out
