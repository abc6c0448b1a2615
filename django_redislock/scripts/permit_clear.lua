-- Operator clear of a Semaphore or ReadWriteLock: drop every holder and wake
-- the front of the queue so waiters re-check at once. Holders learn of it at
-- their next renewal or release (LockLostError).
-- KEYS[1] holder set (ZSET), KEYS[2] holder info (HASH), KEYS[3] queue,
-- KEYS[4] deadlines, KEYS[5] (optional) a Semaphore's limit, dropped when nobody waits
-- ARGV[1] sigprefix, ARGV[2] how many waiters to wake
-- Returns how many live holders were dropped.
local now_ms = server_time()
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms, '+inf')
redis.call('DEL', KEYS[1], KEYS[2])
local front, ends = queue_front(KEYS[3], KEYS[4], now_ms, tonumber(ARGV[2]))
for i, waiter in ipairs(front) do
  signal(ARGV[1], waiter, ends[i] - now_ms)
end
if #front == 0 and KEYS[5] then
  redis.call('DEL', KEYS[5])
end
return live
