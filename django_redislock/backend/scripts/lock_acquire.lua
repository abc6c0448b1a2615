-- Acquire a Lock, fairly: the script half of an acquire.
-- KEYS[1] lock       STRING the holder's value (see _lock_value.lua), with the lease as TTL
-- KEYS[2] fence      STRING fencing counter of this name; optional: derived from the lock key when left out
-- KEYS[3] queue      ZSET   waiters in arrival order; optional, as fence
-- KEYS[4] deadlines  HASH   waiter token -> presumed-dead time; optional, as fence
-- KEYS[5] stats      HASH   usage counters (_stats.lua); optional, as fence
-- ARGV[1] token          the would-be holder's unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on failure; "nest": reentrant re-acquire
--                        (a "try" or "wait" attempt for a token that holds the lock already is
--                        answered as held: sending it again after a lost reply is safe)
-- ARGV[4] fenced         "1": a grant takes a fencing token (the caller asked for one up front,
--                        or Redlock); "0": it is left 0, taken on first use (lock_fence.lua)
-- ARGV[5] holder         description of the holder (host:pid:thread) for operators
-- ARGV[6] since_ms       the holder's wall clock, for display only (never for ordering)
-- ARGV[7] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[8] stats_ttl_ms   how long counters outlive their last update; 0: counting off
-- ARGV[9] waited_ms      ms this call has waited so far; optional, left out on its first attempt
--
-- A Lock's uncontended acquire is no script at all: a plain SET NX PX of the
-- value an unfenced grant writes (token:0:1:0:lease:since:holder). This
-- script runs when that SET found the lock taken, or for a waiter's
-- re-check, or for an acquire that wants its fencing token at once (fenced
-- "1", which then takes a free lock nobody waits for on its fast path below).
-- Of the counters (_stats.lua) this script keeps only 'contended', once per call:
-- 'acquired' and 'wait_ms' are counted by the client, batched (holds/counters.py).
-- A waiter's handoff grant (_handoff.lua) is min(lease_ms, waiter_ttl_ms): no
-- longer than a dead waiter would block the queue anyway. The signal lists
-- are the lock key with its final 'lock' replaced by 'signal:' and a token.
-- A Lock sends only KEYS[1]: its other keys share its name (lock_keys in
-- _lock_value.lua, written out below), which saves the client encoding four
-- keys per call; Redlock sends its four (and no stats).
-- Returns one integer: the fencing token (> 0) when held with one; -1 when
-- held without one yet; 0 when a reentrant acquire finds the lock no longer
-- ours; -2 - retry_hint_ms when refused. A refusal by a held lock is
-- {-2 - retry_hint_ms, value}: the holder's value (read anyway, to see whether
-- it is the caller's), so a caller that gives up can say who held it
-- (LockTimeout.holder) without another round trip.
local lock, fence_key, queue = KEYS[1], KEYS[2], KEYS[3]
if not fence_key then  -- lock_keys, inlined (the preludes come later): only the two needed here
  local base = string.sub(lock, 1, -5)
  fence_key, queue = base .. 'fence', base .. 'queue'
end
local token, lease, mode, fenced = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'

local queue_empty = mode ~= 'nest' and redis.call('EXISTS', queue) == 0
-- The fenced common case, a free lock nobody waits for, written out in full
-- (next_fence inlined): it runs before the preludes, so it pays for none of
-- their closures.
if queue_empty and fenced and redis.call('EXISTS', lock) == 0 then
  -- @include _fence_inline.lua
  redis.call('SET', lock,
    token .. ':0:1:' .. string.format('%.0f', fence) .. ':' .. lease .. ':' .. ARGV[6] .. ':'
      .. ARGV[5], 'PX', lease)
  return fence
end

-- @preludes

local deadlines, stats = KEYS[4], KEYS[5]
if not KEYS[2] then
  local _
  _, _, deadlines, stats = lock_keys(lock)
end
local sigprefix = signal_prefix(lock)
local waited_ms = ARGV[9] or '-1'

-- The retry hint of a held lock: its lease's ms left, at least 1. PTTL says 0
-- in the lease's last millisecond, and a hint of 0 reads as none (the waiter
-- would re-check only after a whole wait chunk); -1 (a key without a TTL,
-- not ours) stays no hint.
local function lease_left()
  local left = redis.call('PTTL', lock)
  if left == 0 then
    return 1
  end
  return left
end

local function refused(hint, value)
  count_contention(stats, ARGV[8], waited_ms)
  if value then
    return {-2 - math.max(hint, 0), value}
  end
  return -2 - math.max(hint, 0)
end

-- The reply of a hold with fencing token `fence` (0: none taken yet).
local function held(fence)
  fence = tonumber(fence)
  if fence > 0 then
    return fence
  end
  return -1
end

-- A new hold of a free lock: its value, with the waiters flag as the queue stands.
local function grant(waiters)
  local fence = 0
  if fenced then
    fence = next_fence(fence_key)
  end
  redis.call('SET', lock, lock_value(token, waiters, 1, fence, lease, ARGV[6], ARGV[5]),
    'PX', lease)
  return held(fence)
end

-- The lock holds this very token already: a waiter re-checking after the lock
-- was handed to it, before it read its signal, or an attempt sent again after
-- its first reply was lost (redis-py's retry policy) that had been granted
-- (the plain SET NX too: retried, it fails on the caller's own value).
-- Either way it is the caller's: take it, with the full lease. (Counted once,
-- by the client that takes it.) This makes an acquire idempotent per token.
-- A caller that asked for its fencing token up front gets one now.
local function handed_over()
  local value = redis.call('GET', lock)
  if not (value and string.sub(value, 1, #token + 1) == token .. ':') then
    return nil, value
  end
  local _, waiters, count, fence, _, since, holder = parse_lock(value)
  if fenced and tonumber(fence) == 0 then
    fence = next_fence(fence_key)
  end
  redis.call('DEL', sigprefix .. token)
  redis.call('SET', lock, lock_value(token, waiters, count, fence, lease, since, holder),
    'PX', lease)
  return held(fence)
end

-- Queue (or re-queue) a refused waiter. Whatever its signal list holds is
-- stale now: a wake-up is being acted on by this very attempt, and a handoff
-- whose first lease ran out (the lock is not ours) must not be taken later.
local function wait_in_line(now_ms, now_us)
  redis.call('DEL', sigprefix .. token)
  local waiter_ttl = tonumber(ARGV[7])
  enqueue(queue, deadlines, token, now_ms, now_us, waiter_ttl,
    ':' .. math.min(tonumber(lease), waiter_ttl) .. ':' .. ARGV[5])
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
  return held(fence)
end

-- Nobody is queued: the caller's SET NX found the lock taken (or, fenced,
-- the fast path above did), unless it was freed since.
if queue_empty then
  local mine, value = handed_over()
  if mine then
    return mine
  end
  if redis.call('EXISTS', lock) == 0 then
    return grant(0)
  end
  local hint = lease_left()
  if mode == 'wait' then
    wait_in_line(server_time())
    mark_waiters(lock)
  end
  return refused(hint, value)
end

-- Someone is queued: the first live waiter is entitled to a free lock.
local now_ms, now_us = server_time()
local hint, value
local is_held = redis.call('EXISTS', lock) == 1
if is_held then
  local mine
  mine, value = handed_over()
  if mine then
    return mine
  end
  hint = lease_left()
else
  local head, deadline = queue_head(queue, deadlines, now_ms)
  if (not head) or head == token then
    if head then
      dequeue(queue, deadlines, sigprefix, token)
    end
    return grant(redis.call('EXISTS', queue))
  end
  signal(sigprefix, head, deadline - now_ms)
  hint = deadline - now_ms
end
if mode == 'wait' then
  wait_in_line(now_ms, now_us)
  if is_held then
    mark_waiters(lock)
  end
end
return refused(hint, value)
