-- A Lock waiter gives up: leave the queue, and pass on what it may have been
-- given in the meantime: a wake-up (when it was first in line) or the lock
-- itself (a handoff it has not taken yet, _handoff.lua).
-- KEYS[1] lock       STRING the holder's value (_lock_value.lua)
-- KEYS[2] queue      ZSET   waiters in arrival order; optional: derived from the lock key when left out
-- KEYS[3] deadlines  HASH   waiter token -> presumed-dead time; optional, as queue
-- KEYS[4] fence      STRING fencing counter of this name; optional, as queue
-- ARGV[1] token          the waiter's token
-- Signal lists are KEYS[1] with its final 'lock' replaced by 'signal:' and a token.
-- Returns 1 when the waiter was queued, 2 when it had been handed the lock, else 0.
local lock, queue, deadlines, fence_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if not queue then
  fence_key, queue, deadlines = lock_keys(lock)
end
local token, sigprefix = ARGV[1], signal_prefix(lock)
if leave_queue(queue, deadlines, sigprefix, token) then
  return 1
end
local value = redis.call('GET', lock)
if value and string.sub(value, 1, #token + 1) == token .. ':' then
  redis.call('DEL', sigprefix .. token)
  pass_on(lock, queue, deadlines, fence_key, sigprefix)
  return 2
end
return 0
