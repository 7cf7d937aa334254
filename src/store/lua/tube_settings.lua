-- tube-settings: a tube's settings.
-- Args: tube
-- Returns them as `options_of` reads them ('' for none).
OPS.tube_settings = function(tube)
  return redis.call('HGET', P .. 'settings', tube) or ''
end
