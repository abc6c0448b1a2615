-- Take a Semaphore permit, fairly, in one round trip.
-- KEYS[1] holders   ZSET   the semaphore (see _permits.lua); exists while held
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order (server µs)
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] member    "<token>:0:<limit>:<since_ms>:<holder>": the would-be holder's
--                   member with no fencing token (0): its unguessable hex token,
--                   then its tail: the caller's limit, its wall clock (display
--                   only, never for ordering), host:pid:thread
-- ARGV[2] lease_ms  lease to set
-- ARGV[3] wait_ms   how long a queued waiter stays presumed alive without
--                   re-checking; negative: never queue ("try")
-- ARGV[4] fenced    '1': take the fencing token now; '0': leave it to first use
--                   (permit_fence.lua)
-- The holder's member is "<token>:<fence>:<tail>", fence 0 when none was taken.
-- An attempt for a token that holds a permit already is answered with that
-- permit (sending it again after a lost reply is safe).
-- Returns the bare fence (0 when not fenced) when granted on the fast path,
-- {1, fence} when granted otherwise; {0, retry_hint_ms} when refused, and
-- {0, retry_hint_ms, member} when refused because every permit is taken:
-- member is the holder whose lease ends first (the hint's), read anyway for
-- the hint, so a caller that gives up can say who holds it (LockTimeout.holder);
-- {-2, limit_in_use} when the name is held under another limit.
--
-- The common case, no holder and nobody waiting, comes first and is written
-- out in full (add_holder inlined; any limit >= 1 has room): it runs before
-- the preludes and pays for none of their closures. Unfenced, it reads no
-- clock and no counter: the sole holder is scored +inf, its lease being the
-- key's TTL (see settle in _permits.lua).
local set, fence_key, queue = KEYS[1], KEYS[2], KEYS[3]

-- @include _permit_fast.lua

-- @preludes

local deadlines, token, tail = KEYS[4], split_member(ARGV[1])
local lease, wait_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, sigprefix = tail_limit(tail), signal_prefix(queue)
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
  local in_use = member_limit(redis.call('ZRANGE', set, 0, 0)[1])
  if in_use ~= limit then
    return {-2, in_use or 0}
  end
end

local free = limit - count
local hint, first
if free > 0 then
  -- The first `free` live waiters are entitled to the free permits; wake them.
  local entitled = true
  if redis.call('EXISTS', queue) == 1 then
    entitled = false
    local front, ends = queue_front(queue, deadlines, now_ms, free)
    for i, waiter in ipairs(front) do
      if waiter == token then
        entitled = true
      else
        signal(sigprefix, waiter, ends[i] - now_ms)
      end
    end
    if entitled then
      dequeue(queue, deadlines, sigprefix, token)
    elseif #front < free then
      entitled = true -- fewer waiters than free permits: nobody is passed over
    end
    hint = math.abs(wait_ms)
  end
  if entitled then
    local fence = ARGV[4] == '1' and next_fence(fence_key, FENCE_MEMORY_MS) or 0
    add_holder(set, holder_member(token, fence, tail), lease, now_ms, count == 0)
    return {1, fence}
  end
else
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
