-- set-tube: set a tube's settings as a whole, whether or not it exists.
-- Args: tube, settings (as `options_of` reads them; '' clears them)
-- Returns 1.
OPS.set_tube = function(tube, options)
  if options == '' then
    redis.call('HDEL', P .. 'settings', tube)
  else
    redis.call('HSET', P .. 'settings', tube, options)
  end
  return 1
end
