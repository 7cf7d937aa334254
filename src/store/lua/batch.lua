-- The dispatcher: runs the operations a call asks for, in order, so that
-- concurrent commands of many connections share one round trip and one
-- function call, then finishes the call. `allowed` names the operations a
-- function may run (its flags suit them).
-- Arguments: prefix, then for each operation: its name, its argument count
-- n, and its n arguments.
-- Returns one result per operation, in order; an operation that failed
-- gives an error in its place and does not stop the others: they came from
-- other clients.
local function dispatcher(allowed)
  return function(_, args)
    begin(args[1])
    local i, n = 2, #args
    while i <= n do
      if args[i] == 'put' then PUTS = PUTS + 1 end
      i = i + 2 + tonumber(args[i + 1])
    end
    local out = {}
    i = 2
    while i <= n do
      local name, argc = args[i], tonumber(args[i + 1])
      local ok, result
      if allowed[name] then
        ok, result = pcall(OPS[name], unpack(args, i + 2, i + 1 + argc))
      else
        ok, result = false, 'delayq: ' .. name .. ' may not run in this function'
      end
      if not ok then
        result = { err = type(result) == 'table' and result.err or tostring(result) }
      end
      out[#out + 1] = result
      i = i + 2 + argc
    end
    finish()
    return out
  end
end
