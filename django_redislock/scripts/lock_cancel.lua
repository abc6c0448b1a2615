-- A Lock waiter gives up: leave the queue, and pass on what it may have been
-- given in the meantime: a wake-up (when it was first in line) or the lock
-- itself (a handoff it has not taken yet, _handoff.lua).
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] deadlines, KEYS[4] fence, KEYS[5] stats
-- ARGV[1] token, ARGV[2] sigprefix, ARGV[3] fence_ttl_ms, ARGV[4] stats_ttl_ms
-- Returns 1 when the waiter was queued, 2 when it had been handed the lock, else 0.
local lock, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local token, sigprefix = ARGV[1], ARGV[2]
local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == token
if dequeue(queue, deadlines, sigprefix, token) then
  if was_head then
    local now_ms = server_time()
    wake_head(queue, deadlines, sigprefix, now_ms)
  end
  return 1
end
local value = redis.call('GET', lock)
if value and string.sub(value, 1, #token + 1) == token .. ':' then
  redis.call('DEL', sigprefix .. token)
  pass_on(lock, queue, deadlines, KEYS[4], KEYS[5], sigprefix, ARGV[3], ARGV[4])
  return 2
end
return 0
