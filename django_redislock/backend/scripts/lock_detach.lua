-- Hand a Lock hold off (Lock.detach): it goes on under the ticket's token, for
-- a whole lease from now, its holder marked detached, until an adopter swaps
-- that token for its own (lock_adopt.lua). Only the outermost level is ever
-- detached (the holder checks its depth), so the count becomes 1.
-- KEYS[1] lock      STRING the holder's value (_lock_value.lua)
-- ARGV[1] token         the holder's token
-- ARGV[2] ticket        the token the hold goes on under (the ticket's)
-- ARGV[3] lease_ms      the detached hold's lease, from now
-- ARGV[4] holder        the holder's description, marked detached here
-- Returns {fence, now_ms}: the hold's fencing token (0: not taken yet) and the
-- server's clock at the detach; fence -1 when the lock is not (or no longer)
-- ARGV[1]'s.
local lock, token = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = redis.call('GET', lock)
if not (value and string.sub(value, 1, #token + 1) == token .. ':') then
  return {-1, now_ms}
end
local _, waiters, _, fence, _, since = parse_lock(value)
local holder = ARGV[4] .. DETACHED_MARK .. string.format('%.0f', now_ms)
redis.call('SET', lock, lock_value(ARGV[2], waiters, 1, fence, ARGV[3], since, holder),
  'PX', ARGV[3])
return {tonumber(fence), now_ms}
