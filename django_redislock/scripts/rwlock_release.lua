-- Release a ReadWriteLock hold and wake whoever may go next: the readers at
-- the front of the queue, or the writer at its head once nobody holds.
-- KEYS[1] rwlock, KEYS[2] holders, KEYS[3] queue, KEYS[4] deadlines
-- ARGV[1] token, ARGV[2] sigprefix
-- Returns 1 when released, 0 when ARGV[1] no longer held a live lease.
local set, info, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now_ms = server_time()
local ours = remove_holder(set, info, ARGV[1], now_ms)
if redis.call('EXISTS', queue) == 1 then
  local count = prune_holders(set, info, now_ms)
  local writing = count > 0 and string.sub(redis.call('ZRANGE', set, 0, 0)[1], 1, 1) == 'w'
  if not writing then
    local front, ends = queue_front(queue, deadlines, now_ms, READER_BATCH)
    for i, waiter in ipairs(front) do
      if string.sub(waiter, 1, 1) == 'w' then
        if i == 1 and count == 0 then
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
