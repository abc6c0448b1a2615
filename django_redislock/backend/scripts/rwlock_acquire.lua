-- Take a ReadWriteLock for reading or writing, fairly, in one round trip.
-- KEYS[1] holders   ZSET   the rwlock (see _permits.lua); exists while held
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order (server µs)
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] member    "<token>:0:0:<since_ms>:<holder>" (see semaphore_acquire.lua);
--                   the token is 'r' or 'w' (the mode) then unguessable hex
-- ARGV[2] lease_ms  lease to set
-- ARGV[3] wait_ms   how long a queued waiter stays presumed alive without
--                   re-checking; negative: never queue ("try")
-- ARGV[4] fenced    '1': take the fencing token now; '0': leave it to first use
-- Returns the bare fence (0 when not fenced) when granted on the fast path,
-- {1, fence} when granted otherwise (the holder's member is
-- "<token>:<fence>:<tail>", fence 0 when none was taken); {0, retry_hint_ms}
-- when refused, {0, retry_hint_ms, member} when refused while held: member is
-- the holder whose lease ends first (the hint's), read anyway for the hint,
-- so a caller that gives up can say who holds it (LockTimeout.holder).
-- An attempt for a token that holds it already is answered with that hold
-- (sending it again after a lost reply is safe).
--
-- Holders are all readers or one writer; the first character of each token
-- says which. A queued writer blocks readers that arrive after it, so a
-- stream of readers cannot starve it.
--
-- Nobody holding and nobody waiting, the common case, comes first: the same
-- calls as a Semaphore's (see semaphore_acquire.lua).
local set, fence_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- @include _permit_fast.lua

-- @preludes

local token, tail = split_member(ARGV[1])
local lease, wait_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local sigprefix = signal_prefix(queue)
local reading = string.sub(token, 1, 1) == 'r'

local now_ms, now_us = server_time()
local count = prune(set, now_ms)
if count == 1 then
  settle(set, now_ms)
end
if count > 0 then
  local mine = held_by(set, token)
  if mine then
    return {1, mine}
  end
end
local compatible = count == 0
if reading and not compatible then
  compatible = string.sub(redis.call('ZRANGE', set, 0, 0)[1], 1, 1) == 'r'
end

if compatible and redis.call('EXISTS', queue) == 1 then
  local entitled = false
  if reading then
    -- Readers ahead of us go along with us, and so do those behind us up to
    -- the first writer: they are woken (a reader let in after a writer that
    -- gave up was woken alone); a writer ahead stops us.
    local front, ends = queue_front(queue, deadlines, now_ms, READER_BATCH)
    local blocked = false
    for i, waiter in ipairs(front) do
      if waiter == token then
        entitled = true
      elseif string.sub(waiter, 1, 1) == 'w' then
        if i == 1 and count == 0 then
          signal(sigprefix, waiter, ends[i] - now_ms)
        end
        blocked = true
        break
      else
        signal(sigprefix, waiter, ends[i] - now_ms)
      end
    end
    if not entitled and not blocked and #front < READER_BATCH then
      entitled = true -- only readers are queued: join them
    end
  else
    local front, ends = queue_front(queue, deadlines, now_ms, 1)
    entitled = (not front[1]) or front[1] == token
    if not entitled then
      signal(sigprefix, front[1], ends[1] - now_ms)
    end
  end
  if entitled then
    dequeue(queue, deadlines, sigprefix, token)
  end
  compatible = entitled
end

if compatible then
  local fence = ARGV[4] == '1' and next_fence(fence_key, FENCE_MEMORY_MS) or 0
  add_holder(set, holder_member(token, fence, tail), lease, now_ms, count == 0)
  return {1, fence}
end

local hint, first = math.abs(wait_ms), nil
if count > 0 then
  first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  hint = tonumber(first[2]) - now_ms
end
if wait_ms > 0 then
  enqueue(queue, deadlines, token, now_ms, now_us, wait_ms, ':0:' .. tail_holder(tail))
end
if first then
  return {0, hint, first[1]}
end
return {0, hint}
