-- Release one level of a Lock held by ARGV[1]; on the last, hand the lock to the
-- first live waiter (_handoff.lua) or free it.
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] deadlines, KEYS[4] fence, KEYS[5] stats
-- ARGV[1] token, ARGV[2] sigprefix, ARGV[3] fence_ttl_ms, ARGV[4] stats_ttl_ms
-- KEYS[2..5] and ARGV[2..4] are used only when the lock has waiters.
-- Returns the remaining hold count (0 when released), or -1 when not the owner.
local lock, token = KEYS[1], ARGV[1]
local value = redis.call('GET', lock)
if not value then
  return -1
end
-- The value starts '<token>:<waiters>:<count>:' (_lock_value.lua); tokens are hex.
local mine = #token + 1
if string.sub(value, 1, mine) ~= token .. ':' then
  return -1
end
local flags = string.sub(value, mine + 1, mine + 4)
if flags == '0:1:' then  -- the common case, before the preludes' closures
  redis.call('DEL', lock)
  return 0
end

-- @preludes

if flags == '1:1:' then
  pass_on(lock, KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2], ARGV[3], ARGV[4])
  return 0
end
local owner, waiters, count, fence, lease, since, holder = parse_lock(value)
count = tonumber(count)
redis.call('SET', lock, lock_value(owner, waiters, count - 1, fence, lease, since, holder),
  'KEEPTTL')
return count - 1
