-- peek: look at a job without changing it.
-- Args: 'id' | 'ready' | 'delayed' | 'buried', id or tube
-- Returns {id, tube, body} or false.
OPS.peek = function(mode, arg)
  local key, job
  if mode == 'id' then
    key, job = key_of(arg)
  elseif mode == 'delayed' then
    local first = first_delayed(arg, 1)[1]
    if first then key = first[2]; job = load(key) end
  else
    key = redis.call('ZRANGE', tube_key(mode, arg), 0, 0)[1]
    if key then job = load(key) end
  end
  if key == nil or job == nil then return false end
  return body_of(key, job)
end
