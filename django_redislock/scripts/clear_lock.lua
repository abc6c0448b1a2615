-- An operator clears a Lock (manage.py locks clear, the admin's force-release):
-- delete it whoever holds it, and wake the first waiter as a release would, so
-- the queue moves on at once. The holder learns of it at its next renewal or
-- release, which find the lease gone (LockLostError, lock_lost).
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] deadlines
-- ARGV[1] sigprefix
-- Returns 1 when a lock was deleted, else 0.
local lock, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local deleted = redis.call('DEL', lock)
if redis.call('EXISTS', queue) == 1 then
  local now_ms = server_time()
  wake_head(queue, deadlines, ARGV[1], now_ms)
end
return deleted
