-- The dispatcher: runs the operations a call asks for, in order, so that
-- concurrent commands of many connections share one round trip and one
-- function call, then finishes the call. `allowed` names the operations a
-- function may run (its flags suit them).
-- Arguments: prefix, how many of the operations are puts, then for each
-- operation its name and its arguments (ARITY says how many).
-- Returns one result per operation, in order; an operation that failed
-- gives an error in its place and does not stop the others: they came from
-- other clients.
local ARITY = {
  put = 6, reserve = 2, reserve_job = 2, give_back = 2, delete = 3, release = 4,
  bury = 3, touch = 2, kick = 3, kick_job = 1, pause_tube = 2, release_all = 2,
  tick = 2, tube_ref = 4, peek = 2, stats_job = 1, stats_tube = 1, stats = 0,
  list_tubes = 0,
}

local function dispatcher(allowed)
  return function(_, args)
    begin(args[1], tonumber(args[2]))
    local i, n = 3, #args
    local out = {}
    while i <= n do
      local name = args[i]
      local argc = ARITY[name]
      local ok, result
      if argc == nil then
        -- The rest of the call cannot be split into operations.
        return redis.error_reply('delayq: unknown operation ' .. tostring(name))
      elseif allowed[name] then
        ok, result = pcall(OPS[name], unpack(args, i + 1, i + argc))
      else
        ok, result = false, 'delayq: ' .. name .. ' may not run in this function'
      end
      if not ok then
        result = { err = type(result) == 'table' and result.err or tostring(result) }
      end
      out[#out + 1] = result
      i = i + 1 + argc
    end
    finish()
    return out
  end
end
