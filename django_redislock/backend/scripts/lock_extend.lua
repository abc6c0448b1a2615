-- Reset the lease of a Lock held by ARGV[1] to ARGV[2] ms from now.
-- KEYS[1] lock      STRING the holder's value (_lock_value.lua)
-- ARGV[1] token         the holder's token
-- ARGV[2] lease_ms      the new lease
-- Returns 1 when extended, 0 when the lock is not (or no longer) ARGV[1]'s.
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
local owner, waiters, count, fence, _, since, holder = parse_lock(value)
if owner ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], lock_value(owner, waiters, count, fence, ARGV[2], since, holder),
  'PX', ARGV[2])
return 1
