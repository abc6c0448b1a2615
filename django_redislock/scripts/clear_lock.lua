-- An operator clears Locks (manage.py locks clear, the admin's force-release):
-- delete each whoever holds it, and wake its first waiter as a release would,
-- so the queue moves on at once. A holder learns of it at its next renewal or
-- release, which find the lease gone (LockLostError, lock_lost).
-- Per name: these KEYS and ARGV for the first name, then the next name's, so
-- the i-th name (1-based) has KEYS[3i-2] lock, KEYS[3i-1] queue, KEYS[3i]
-- deadlines and ARGV[i] sigprefix.
-- KEYS[1] lock
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] sigprefix  its signal lists' prefix
-- One name per call on Redis Cluster (its keys share a slot); up to a hundred
-- elsewhere, each O(1) apart from the wake-up.
-- Returns {deleted_1, deleted_2, ...}: 1 when that name's lock was deleted, else 0.
local out = {}
local now_ms
for i = 1, #ARGV do
  local lock, queue, deadlines = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  out[i] = redis.call('DEL', lock)
  if redis.call('EXISTS', queue) == 1 then
    now_ms = now_ms or server_time()
    wake_head(queue, deadlines, ARGV[i], now_ms)
  end
end
return out
