-- all-settings: every tube's settings, for an export.
-- Args: none
-- Returns {tube, settings, tube, settings...} (settings as `options_of`
-- reads them).
OPS.all_settings = function()
  return redis.call('HGETALL', P .. 'settings')
end
