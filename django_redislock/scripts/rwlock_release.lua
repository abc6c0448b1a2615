-- Release a ReadWriteLock hold and wake whoever may go next: the readers at
-- the front of the queue, or the writer at its head once nobody holds.
-- KEYS[1] rwlock, KEYS[2] queue, KEYS[3] deadlines
-- ARGV[1] the holder's member, ARGV[2] sigprefix
-- Returns 1 when released, 0 when ARGV[1] no longer held a live lease.
local set, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local now_ms = server_time()
local ours = remove_holder(set, ARGV[1], now_ms)
if redis.call('EXISTS', queue) == 1 then
  local first = redis.call('ZRANGE', set, 0, 0)[1]
  if not (first and string.sub(first, 1, 1) == 'w') then
    local front, ends = queue_front(queue, deadlines, now_ms, READER_BATCH)
    for i, waiter in ipairs(front) do
      if string.sub(waiter, 1, 1) == 'w' then
        if i == 1 and not first then
          signal(ARGV[2], waiter, ends[i] - now_ms)
        end
        break
      end
      signal(ARGV[2], waiter, ends[i] - now_ms)
    end
  end
end
if ours then
  return 1
end
return 0
