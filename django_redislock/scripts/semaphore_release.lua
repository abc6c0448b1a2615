-- Return a Semaphore permit and wake the waiters entitled to the free permits.
-- KEYS[1] semaphore, KEYS[2] holders, KEYS[3] limit, KEYS[4] queue, KEYS[5] deadlines
-- ARGV[1] token, ARGV[2] sigprefix
-- Returns 1 when released, 0 when the permit was not (or no longer) held by ARGV[1].
local set, info, limit_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now_ms = server_time()
local ours = remove_holder(set, info, ARGV[1], now_ms)
if redis.call('EXISTS', queue) == 1 then
  local limit = tonumber(redis.call('GET', limit_key) or '1')
  local free = limit - prune_holders(set, info, now_ms)
  if free > 0 then
    local front, ends = queue_front(queue, deadlines, now_ms, free)
    for i, waiter in ipairs(front) do
      signal(ARGV[2], waiter, ends[i] - now_ms)
    end
  end
elseif redis.call('EXISTS', set) == 0 then
  redis.call('DEL', limit_key)
end
if ours then
  return 1
end
return 0
