-- Record a Redlock holder's fencing token on one instance, so every later
-- holder that is granted this instance gets a larger one.
-- KEYS[1] lock   STRING the holder's value (see _lock_value.lua)
-- KEYS[2] fence  STRING fencing counter of this name on this instance
-- ARGV[1] token         the holder's token
-- ARGV[2] fencing_token the holder's fencing token (the largest counter of its quorum)
-- A counter that has no lifetime gets FENCE_MEMORY_MS less the slack (_queue.lua),
-- so that this instance's next grant moves it up to its clock.
-- Returns 1 when the holder still holds the lock here (the counter is now at
-- least ARGV[2]), 0 when it does not.
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
local owner = parse_lock(value)
if owner ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl <= 0 then  -- new here: moved up to the clock at this instance's next grant
    ttl = FENCE_MEMORY_MS - FENCE_SLACK_MS - 1
  end
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
end
return 1
