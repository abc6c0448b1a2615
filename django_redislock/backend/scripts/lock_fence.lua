-- Take the fencing token of a Lock hold that has none yet: its first use.
-- KEYS[1] lock   STRING the holder's value (_lock_value.lua)
-- KEYS[2] fence  STRING fencing counter of this name; optional: derived from the lock key when left out
-- ARGV[1] token         the holder's token
-- The token comes from the same counter as an acquire's (next_fence in
-- _queue.lua), so it is larger than every token given out for the name
-- before, and is kept in the value: asked again, the same token.
-- Returns the fencing token (> 0), or 0 when the lock is not (or no longer)
-- ARGV[1]'s: a lost hold gets no token.
local lock, fence_key, token = KEYS[1], KEYS[2], ARGV[1]
local value = redis.call('GET', lock)
if not (value and string.sub(value, 1, #token + 1) == token .. ':') then
  return 0
end
local owner, waiters, count, fence, lease, since, holder = parse_lock(value)
fence = tonumber(fence)
if fence == 0 then
  if not fence_key then
    fence_key = lock_keys(lock)
  end
  fence = next_fence(fence_key)
  redis.call('SET', lock, lock_value(owner, waiters, count, fence, lease, since, holder),
    'KEEPTTL')
end
return fence
