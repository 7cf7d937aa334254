-- reserve: take the most urgent ready job of the unpaused tubes given.
-- ARGV: prefix, owner, tube...
-- Returns {id, tube, body, ttr} or false.
local owner, now = ARGV[2], now_ms()
local best_key, best_pri
for i = 3, #ARGV do
  local tube = ARGV[i]
  local until_ms = tonumber(redis.call('HGET', tube_key('tube', tube), 'until') or 0)
  if until_ms <= now then
    local first = redis.call('ZRANGE', tube_key('ready', tube), 0, 0, 'WITHSCORES')
    if first[1] then
      local pri = tonumber(first[2])
      if best_key == nil or pri < best_pri or (pri == best_pri and first[1] < best_key) then
        best_key, best_pri = first[1], pri
      end
    end
  end
end
if best_key == nil then return false end
return reserve_key(best_key, load(best_key), owner, now)
