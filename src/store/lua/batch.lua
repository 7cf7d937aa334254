-- The dispatcher: runs the operations a call asks for, in order, so that
-- concurrent commands of many connections share one round trip and one
-- function call, then finishes the call. `allowed` names the operations a
-- function may run (its flags suit them).
-- Arguments: prefix, how many of the operations are puts, the call's mode
-- (below), then for each
-- operation its name and its arguments (ARITY says how many).
-- Returns one result per operation, in order; an operation that failed
-- gives an error in its place and does not stop the others: they came from
-- other clients. On a shard of a cluster the first ready jobs of the
-- tubes the call changed follow (see `heads` in the prelude).
local ARITY = {
  put = 7, reserve = 2, reserve_job = 2, give_back = 2, delete = 3, release = 4,
  bury = 3, touch = 2, kick = 3, kick_job = 1, pause_tube = 3, hold_tube = 2, release_all = 3,
  tick = 2, tube_ref = 5, restore_refs = 3, peek = 2, stats_job = 1, stats_tube = 1, stats = 0,
  list_tubes = 0, inventory = 0, live = 0, pauses = 0, firsts = 3, ids = 1,
  forget_births = 1, forget_counts = 1, set_tube = 2, tube_settings = 1,
  reserve_many = 4, delete_many = 3, set_schedule = 3, schedules = 0,
  export = 2, import = 20, claim_key = 1, all_settings = 0,
}

-- How long a sharded call's reply is kept under its token, in ms: longer
-- than a cluster client goes on retrying a call (delayq gives up on a call
-- after 2 s).
local REPLY_KEPT_MS = 5000

local function dispatcher(allowed)
  return function(_, args)
    -- args[3]: '' on one Redis; on a cluster 's:' (a shard) or 'c:' (the
    -- control slot) and the call's token. The cluster client sends a call again when its reply was lost
    -- (a timeout, a dropped connection), so a call may arrive twice: the
    -- second time it changes nothing and returns the first reply.
    local kind, token = string.match(args[3], '^([sc]):(.+)$')
    begin(args[1], tonumber(args[2]), token ~= nil, kind == 'c')
    local done
    if token ~= nil then
      done = P .. 'call:' .. token
      local first = redis.call('GET', done)
      if first then
        -- A write: a WAIT after this call (--redis-wait) counts replicas
        -- for this connection's writes, and the first run's were perhaps
        -- on another connection. This one is later than them.
        redis.call('PEXPIRE', done, REPLY_KEPT_MS)
        return cmsgpack.unpack(first)
      end
    end
    local i, n = 4, #args
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
    local heads = finish()
    if heads ~= nil then out[#out + 1] = heads end
    if done ~= nil then redis.call('SET', done, cmsgpack.pack(out), 'PX', REPLY_KEPT_MS) end
    return out
  end
end
