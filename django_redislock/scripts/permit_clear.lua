-- Operator clear of a Semaphore or ReadWriteLock: drop every holder and wake
-- the front of the queue so waiters re-check at once. Holders learn of it at
-- their next renewal or release (LockLostError).
-- KEYS[1] holders   the primitive's holder ZSET
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] sigprefix
-- Returns how many live holders were dropped. Keys of another type (written by
-- hand) are deleted unread, the holders key counted as one holder.
local now_ms = server_time()
local odd = 0
for i, wanted in ipairs({'zset', 'zset', 'hash'}) do
  local found = redis.call('TYPE', KEYS[i]).ok
  if found ~= 'none' and found ~= wanted then
    redis.call('DEL', KEYS[i])
    if i == 1 then
      odd = 1
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
local wake = first and member_limit(first) or 0 -- a Semaphore's limit; 0 for a ReadWriteLock
if wake == 0 then
  wake = READER_BATCH
end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms, '+inf') + odd
redis.call('DEL', KEYS[1])
wake_front(KEYS[2], KEYS[3], ARGV[1], now_ms, wake)
return live
