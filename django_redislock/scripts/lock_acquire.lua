-- Acquire a Lock, fairly, in one round trip.
-- KEYS[1] lock      STRING the holder's value (see _lock_value.lua), with the lease as TTL
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] token          the would-be holder's unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on failure; "nest": reentrant re-acquire
--                        (a "try" or "wait" attempt for a token that holds the lock already is
--                        answered as held: sending it again after a lost reply is safe)
-- ARGV[4] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[5] sigprefix      prefix of the per-waiter signal lists
-- ARGV[6] holder         description of the holder (host:pid:thread) for operators
-- ARGV[7] fence_ttl_ms   how long a fencing counter lives after it is (re)created
-- ARGV[8] since_ms       the holder's wall clock, for display only (never for ordering)
-- KEYS[5] stats     HASH   usage counters (_stats.lua); optional
-- ARGV[9] stats_ttl_ms   how long counters outlive their last update; 0: counting off
-- ARGV[10] waited_ms     -1 on a call's first attempt, else ms it has waited so far
-- ARGV[11] grant_ms      first lease of a handoff to this waiter (_handoff.lua)
-- Returns one integer: the fencing token (> 0) when held; 0 when a reentrant
-- acquire finds the lock no longer ours; -1 - retry_hint_ms when refused.
--
-- The common case, a free lock nobody waits for, comes first and is written
-- out in full (next_fence and count_acquire inlined): it runs before the
-- preludes, so it pays for none of their closures, and it is most of the
-- server time of an uncontended lock.
local lock, fence_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, lease, mode = ARGV[1], ARGV[2], ARGV[3]
local sigprefix = ARGV[5]

local queue_empty = mode ~= 'nest' and redis.call('EXISTS', queue) == 0
local fence
if queue_empty then
  fence = redis.call('INCR', fence_key)
  if fence == 1 then  -- (re)created: start at the server clock, as next_fence does
    local t = redis.call('TIME')
    fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', ARGV[7])
  end
  if redis.call('SET', lock,
      token .. ':0:1:' .. string.format('%.0f', fence) .. ':' .. lease .. ':' .. ARGV[8] .. ':'
        .. ARGV[6], 'NX', 'PX', lease) then
    if KEYS[5] and ARGV[9] and ARGV[9] ~= '0' then  -- count_acquire (Redlock passes no stats)
      if redis.call('HINCRBY', KEYS[5], 'acquired', 1) % 64 == 1 then
        redis.call('PEXPIRE', KEYS[5], ARGV[9])
      end
      if tonumber(ARGV[10]) > 0 then
        redis.call('HINCRBY', KEYS[5], 'wait_ms', ARGV[10])
      end
    end
    return fence
  end
end

-- @preludes

local function acquired(fence)
  count_acquire(KEYS[5], ARGV[9], ARGV[10])
  return fence
end

local function refused(hint)
  count_contention(KEYS[5], ARGV[9], ARGV[10])
  return -1 - math.max(hint, 0)
end

-- The lock holds this very token already: a waiter re-checking after the lock
-- was handed to it, before it read its signal, or an attempt sent again after
-- its first reply was lost (redis-py's retry policy) that had been granted.
-- Either way it is the caller's: take it, with the full lease. (Counted when
-- it was granted or handed over.) This makes an acquire idempotent per token.
local function handed_over()
  local value = redis.call('GET', lock)
  if not (value and string.sub(value, 1, #token + 1) == token .. ':') then
    return nil
  end
  local _, waiters, count, fence, _, since, holder = parse_lock(value)
  redis.call('DEL', sigprefix .. token)
  redis.call('SET', lock, lock_value(token, waiters, count, fence, lease, since, holder),
    'PX', lease)
  return tonumber(fence)
end

-- Queue (or re-queue) a refused waiter. Whatever its signal list holds is
-- stale now: a wake-up is being acted on by this very attempt, and a handoff
-- whose first lease ran out (the lock is not ours) must not be taken later.
local function wait_in_line(now_ms, now_us)
  redis.call('DEL', sigprefix .. token)
  enqueue(queue, deadlines, token, now_ms, now_us, tonumber(ARGV[4]),
    ':' .. (ARGV[11] or '0') .. ':' .. ARGV[6])
end

if mode == 'nest' then
  local value = redis.call('GET', lock)
  local owner, waiters, count, fence, _, since, holder
  if value then
    owner, waiters, count, fence, _, since, holder = parse_lock(value)
  end
  if owner ~= token then
    return 0
  end
  redis.call('SET', lock, lock_value(token, waiters, count + 1, fence, lease, since, holder),
    'PX', lease)
  return tonumber(fence)
end

-- Nobody was queued but the lock is taken (the fast path's SET NX failed).
if queue_empty then
  local mine = handed_over()
  if mine then
    return mine
  end
  local hint = redis.call('PTTL', lock)
  if mode == 'wait' then
    wait_in_line(server_time())
    mark_waiters(lock)
  end
  return refused(hint)
end

-- Someone is queued: the first live waiter is entitled to a free lock.
local now_ms, now_us = server_time()
local hint
local held = redis.call('EXISTS', lock) == 1
if held then
  local mine = handed_over()
  if mine then
    return mine
  end
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
  wait_in_line(now_ms, now_us)
  if held then
    mark_waiters(lock)
  end
end
return refused(hint)
