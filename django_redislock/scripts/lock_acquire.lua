-- Acquire a Lock, fairly, in one round trip.
-- KEYS[1] lock      STRING the holder's value (see _lock_value.lua), with the lease as TTL
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] token          the would-be holder's unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on failure; "nest": reentrant re-acquire
-- ARGV[4] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[5] sigprefix      prefix of the per-waiter signal lists
-- ARGV[6] holder         description of the holder (host:pid:thread) for operators
-- ARGV[7] fence_ttl_ms   how long a fencing counter lives after it is (re)created
-- ARGV[8] since_ms       the holder's wall clock, for display only (never for ordering)
-- KEYS[5] stats     HASH   usage counters (_stats.lua); optional
-- ARGV[9] stats_ttl_ms   how long counters outlive their last update; 0: counting off
-- ARGV[10] waited_ms     -1 on a call's first attempt, else ms it has waited so far
-- Returns {1, fence} when held; {0, retry_hint_ms} when not; {-1, 0} when a
-- reentrant acquire finds the lock no longer ours.
local lock, fence_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, lease, mode = ARGV[1], ARGV[2], ARGV[3]
local sigprefix = ARGV[5]

local function acquired(fence)
  count_acquire(KEYS[5], ARGV[9], ARGV[10])
  return {1, fence}
end

local function refused(hint)
  count_contention(KEYS[5], ARGV[9], ARGV[10])
  return {0, hint}
end

if mode == 'nest' then
  local value = redis.call('GET', lock)
  local owner, waiters, count, fence, _, since, holder
  if value then
    owner, waiters, count, fence, _, since, holder = parse_lock(value)
  end
  if owner ~= token then
    return {-1, 0}
  end
  redis.call('SET', lock, lock_value(token, waiters, count + 1, fence, lease, since, holder),
    'PX', lease)
  return {1, tonumber(fence)}
end

-- Fast path: nobody is queued, so a free lock is ours with one SET NX.
if redis.call('EXISTS', queue) == 0 then
  local fence = next_fence(fence_key, tonumber(ARGV[7]))
  if redis.call('SET', lock, lock_value(token, 0, 1, fence, lease, ARGV[8], ARGV[6]),
      'NX', 'PX', lease) then
    return acquired(fence)
  end
  local hint = redis.call('PTTL', lock)
  if mode == 'wait' then
    local now_ms, now_us = server_time()
    enqueue(queue, deadlines, token, now_ms, now_us, tonumber(ARGV[4]))
    mark_waiters(lock)
  end
  return refused(hint)
end

-- Someone is queued: the first live waiter is entitled to a free lock.
local now_ms, now_us = server_time()
local hint
local held = redis.call('EXISTS', lock) == 1
if held then
  hint = redis.call('PTTL', lock)
else
  local head, deadline = queue_head(queue, deadlines, now_ms)
  if (not head) or head == token then
    if head then
      dequeue(queue, deadlines, sigprefix, token)
    end
    local fence = next_fence(fence_key, tonumber(ARGV[7]))
    local waiters = redis.call('EXISTS', queue)
    redis.call('SET', lock, lock_value(token, waiters, 1, fence, lease, ARGV[8], ARGV[6]),
      'PX', lease)
    return acquired(fence)
  end
  signal(sigprefix, head, deadline - now_ms)
  hint = deadline - now_ms
end
if mode == 'wait' then
  enqueue(queue, deadlines, token, now_ms, now_us, tonumber(ARGV[4]))
  if held then
    mark_waiters(lock)
  end
end
return refused(hint)
