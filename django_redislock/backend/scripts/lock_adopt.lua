-- Adopt a detached Lock hold (Lock.adopt): swap the ticket's token for the
-- adopter's in one step, so exactly one adopter gets it and the ticket is
-- spent. The hold keeps its fencing token, waiters flag and since.
-- KEYS[1] lock      STRING the holder's value (_lock_value.lua)
-- ARGV[1] ticket        the detached hold's token (the ticket's)
-- ARGV[2] token         the adopter's new token
-- ARGV[3] lease_ms      the lease, from now
-- ARGV[4] holder        the adopter's description
-- Returns the hold's fencing token (0: not taken yet); -1 when the lock is
-- free (its lease ran out, or it was released or cleared), -2 when another
-- token holds it (the ticket was adopted already, or the name was taken
-- again after its lease ran out). Idempotent per adopter: a call that finds
-- the adopter's token holding it already (redis-py retried it after a lost
-- reply) answers as the first did.
local lock, ticket, token = KEYS[1], ARGV[1], ARGV[2]
local value = redis.call('GET', lock)
if not value then
  return -1
end
local owner, waiters, _, fence, _, since = parse_lock(value)
if owner == token then
  return tonumber(fence)
end
if owner ~= ticket then
  return -2
end
redis.call('SET', lock, lock_value(ARGV[2], waiters, 1, fence, ARGV[3], since, ARGV[4]),
  'PX', ARGV[3])
return tonumber(fence)
