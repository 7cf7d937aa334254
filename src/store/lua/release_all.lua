-- release all: a connection closed; every job it holds goes back to ready.
-- ARGV: prefix, owner, batch
-- Returns {released, tube...}: call again while `released` equals the batch.
local held = P .. 'held:' .. ARGV[2]
local keys = redis.call('SRANDMEMBER', held, tonumber(ARGV[3]))
local out = { #keys }
for _, key in ipairs(keys) do
  local job = load(key)
  unlink(key, job)
  job[OWNER] = ''
  link(key, job, 'ready', 0)
end
for tube in pairs(announced) do out[#out + 1] = tube end
return out
