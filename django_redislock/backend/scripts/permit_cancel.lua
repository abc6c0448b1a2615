-- Undo a Semaphore or ReadWriteLock acquire: the waiter leaves the queue or,
-- when Redis granted the attempt a permit its caller never learned of (the
-- reply lost for good, the caller interrupted or cancelled, or Redis running
-- the attempt after the caller gave up on it), the permit goes back at once
-- instead of belonging to nobody for its whole lease. Also how a waiter that
-- gives up leaves the queue (its last attempt was refused: it holds nothing).
-- KEYS[1] holders    ZSET (see _permits.lua)
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] token      the attempt's (a holder's member starts '<token>:')
-- ARGV[2] limit      optional: a Semaphore's limit (0 or left out: a ReadWriteLock)
-- Returns 1 when the waiter was queued, 2 when it held a permit, else 0.
--
-- A Semaphore waiter leaving the queue may have been woken for a free permit
-- without being at its head (a release wakes the first `free` waiters): the
-- waiter that its leaving brings among the first `free` is woken in its stead,
-- rather than sleeping through a free permit until its wait chunk ends. (A
-- ReadWriteLock needs no more than leave_queue's pass-on at the head: a
-- writer is woken only there, and readers are woken together.)
local set, queue, deadlines, token = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local sigprefix = signal_prefix(queue)
if leave_queue(queue, deadlines, sigprefix, token) then
  local limit = tonumber(ARGV[2] or '0')
  if limit > 0 and redis.call('EXISTS', queue) == 1 then
    local now_ms = server_time()
    local free = limit - prune(set, now_ms)
    if free > 0 then
      wake_front(queue, deadlines, sigprefix, now_ms, free)
    end
  end
  return 1
end
local member, ends = holder_of(set, token)
if not member then
  return 0
end
redis.call('DEL', sigprefix .. token)  -- a wake-up it will never read
give_back(set, queue, deadlines, member, ends)
return 2
