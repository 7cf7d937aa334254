-- restore_refs: the process's counts were gone from Redis (see `tick`), or
-- may be wrong: all of them again, with the mark '#' that says they are
-- there. A count whose operation is newer than these (its call was written
-- after this one's, and ran first) is kept as it is; a count older than
-- these that comes later changes nothing (see `latest_ref`).
-- Args: process, its counts as 'FIELD:TUBE COUNT' pairs separated by
-- spaces (no tube name has a space), their version
-- Returns 1.
OPS.restore_refs = function(process, counts, version)
  local refs = P .. 'refs:' .. process
  alive(process)
  local versions = P .. 'refv:' .. process
  local v = tonumber(version)
  if v <= (tonumber(redis.call('ZSCORE', versions, '#')) or 0) then
    return 1
  end
  local function newer(name)
    return (tonumber(redis.call('ZSCORE', versions, name)) or 0) > v
  end
  local old = {}
  local had = redis.call('HGETALL', refs)
  for i = 1, #had, 2 do old[had[i]] = had[i + 1] end
  redis.call('DEL', refs)
  local args = { '#', 1 }
  local kept = {}
  local function keep(name, count)
    kept[name] = true
    ensure_tube(string.sub(name, 3))
    args[#args + 1], args[#args + 2] = name, count
    -- unpack takes a few thousand values at most.
    if #args >= 200 then
      redis.call('HSET', refs, unpack(args))
      args = {}
    end
  end
  for name, count in string.gmatch(counts, '(%S+) (%d+)') do
    if not newer(name) then keep(name, count) end
  end
  for name, count in pairs(old) do
    if name ~= '#' and not kept[name] and newer(name) then keep(name, count) end
  end
  if #args > 0 then redis.call('HSET', refs, unpack(args)) end
  -- The argument, not `v` (see `latest_ref`).
  redis.call('ZADD', versions, version, '#')
  -- Counts Redis had that the process no longer has (a change that failed
  -- and was undone) may leave their tubes unused.
  for name in pairs(old) do
    if name ~= '#' and not kept[name] then maybe_unused(string.sub(name, 3)) end
  end
  return 1
end
