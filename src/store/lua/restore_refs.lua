-- restore_refs: the process's counts were gone from Redis (see `tick`):
-- all of them again, with the mark '#' that says they are there.
-- Args: process, its counts as 'FIELD:TUBE COUNT' pairs separated by
-- spaces (no tube name has a space)
-- Returns 1.
OPS.restore_refs = function(process, counts)
  local refs = P .. 'refs:' .. process
  alive(process)
  -- Counts Redis had that the process no longer has (a change that failed
  -- and was undone) may leave their tubes unused.
  local old = redis.call('HKEYS', refs)
  redis.call('DEL', refs)
  local args = { '#', 1 }
  local kept = {}
  for name, count in string.gmatch(counts, '(%S+) (%d+)') do
    kept[name] = true
    ensure_tube(string.sub(name, 3))
    args[#args + 1], args[#args + 2] = name, count
    -- unpack takes a few thousand values at most.
    if #args >= 200 then
      redis.call('HSET', refs, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('HSET', refs, unpack(args)) end
  for _, name in ipairs(old) do
    if name ~= '#' and not kept[name] then maybe_unused(string.sub(name, 3)) end
  end
  return 1
end
