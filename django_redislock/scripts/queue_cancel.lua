-- A waiter gives up: leave the queue and, if it was at the front (so it may have
-- been sent the wake-up), pass the wake-up on to the next waiter.
-- KEYS[1] queue
-- KEYS[2] deadlines
-- ARGV[1] token      the waiter's
-- ARGV[2] sigprefix  its signal lists' prefix
-- Returns 1 when the waiter was queued, else 0.
local queue, deadlines = KEYS[1], KEYS[2]
local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == ARGV[1]
if dequeue(queue, deadlines, ARGV[2], ARGV[1]) then
  if was_head then
    local now_ms = server_time()
    wake_head(queue, deadlines, ARGV[2], now_ms)
  end
  return 1
end
return 0
