-- Return a Semaphore permit and wake the waiters entitled to the free permits.
-- KEYS[1] semaphore, KEYS[2] queue, KEYS[3] deadlines
-- ARGV[1] the holder's member, ARGV[2] sigprefix, ARGV[3] limit
-- Returns 1 when released, 0 when the permit was not (or no longer) ARGV[1]'s.
-- Nobody waiting, the common case, returns before the preludes' closures.
local set, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)  -- as remove_holder does
local ours = redis.call('ZREM', set, ARGV[1]) == 1
if redis.call('EXISTS', queue) == 0 then
  return ours and 1 or 0
end

-- @preludes

do
  local free = tonumber(ARGV[3]) - redis.call('ZCARD', set)
  if free > 0 then
    wake_front(queue, deadlines, ARGV[2], now_ms, free)
  end
end
if ours then
  return 1
end
return 0
