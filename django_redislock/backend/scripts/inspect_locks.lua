-- Read many Locks at once for operators (manage.py locks, the admin dashboard).
-- Per name: KEYS[i] is the lock key of the i-th name.
-- KEYS[1] lock
-- Returns {value_1 or false, pttl_1, value_2 or false, pttl_2, ...}; a key of
-- another type (written by hand) answers the value '' rather than failing the
-- whole call, so one odd key never hides every lock from the operator.
-- Callers send at most a few hundred keys per call: two O(1) reads per key keep
-- one call well under a millisecond, so it never blocks the server noticeably.
-- Not used on Redis Cluster, where the keys of one call span hash slots.
local out = {}
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    value = ''
  end
  out[2 * i - 1] = value
  out[2 * i] = redis.call('PTTL', key)
end
return out
