-- Return a Semaphore permit and wake the waiters entitled to the free permits.
-- KEYS[1] semaphore, KEYS[2] queue, KEYS[3] deadlines
-- ARGV[1] the holder's member, ARGV[2] sigprefix, ARGV[3] limit
-- Returns 1 when released, 0 when the permit was not (or no longer) ARGV[1]'s.
local set, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local now_ms = server_time()
local ours = remove_holder(set, ARGV[1], now_ms)
if redis.call('EXISTS', queue) == 1 then
  local free = tonumber(ARGV[3]) - redis.call('ZCARD', set)
  if free > 0 then
    wake_front(queue, deadlines, ARGV[2], now_ms, free)
  end
end
if ours then
  return 1
end
return 0
