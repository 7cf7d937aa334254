-- schedules: every schedule, as the Rust side encoded it.
-- Args: none
-- Returns them, in no order.
OPS.schedules = function()
  return redis.call('HVALS', P .. 'schedules')
end
