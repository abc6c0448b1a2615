-- Return a Semaphore permit or a ReadWriteLock hold, and wake whoever may go
-- next: for a Semaphore the waiters entitled to the free permits; for a
-- ReadWriteLock the readers at the front of the queue, or the writer at its
-- head once nobody holds.
-- KEYS[1] holders ZSET (see _permits.lua)
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] member  the holder's (its limit, 0 for a ReadWriteLock, says which)
-- Returns 1 when released, 0 when the permit was not (or no longer) ARGV[1]'s
-- (its lease had ended, or it was cleared).
--
-- The common case, a sole holder and nobody waiting, comes first and reads no
-- clock. A holder taken on the fast path is scored +inf while it is alone and
-- nobody queued (see settle in _permits.lua): its lease is the key's TTL, so
-- finding it means the lease was live, and there is nobody to wake. Otherwise
-- a sole holder's lease is still the key's TTL (pin_ttl).
local set, queue, member = KEYS[1], KEYS[2], ARGV[1]
local ends = redis.call('ZSCORE', set, member)
if ends == 'inf' then
  redis.call('DEL', set)  -- it holds only us
  return 1
end
if ends then
  redis.call('ZREM', set, member)
end
if redis.call('EXISTS', set, queue) == 0 then
  return ends and 1 or 0
end

-- @preludes

local now_ms = server_time()
local ours = ends ~= false and tonumber(ends) > now_ms
local count = prune(set, now_ms, ends ~= false)
if redis.call('EXISTS', queue) == 0 then
  return ours and 1 or 0
end
local deadlines, sigprefix = KEYS[3], signal_prefix(queue)
local limit = member_limit(member)
if limit > 0 then
  local free = limit - count
  if free > 0 then
    wake_front(queue, deadlines, sigprefix, now_ms, free)
  end
else
  local first = redis.call('ZRANGE', set, 0, 0)[1]
  if not (first and string.sub(first, 1, 1) == 'w') then
    local front, dues = queue_front(queue, deadlines, now_ms, READER_BATCH)
    for i, waiter in ipairs(front) do
      if string.sub(waiter, 1, 1) == 'w' then
        if i == 1 and not first then
          signal(sigprefix, waiter, dues[i] - now_ms)
        end
        break
      end
      signal(sigprefix, waiter, dues[i] - now_ms)
    end
  end
end
return ours and 1 or 0
