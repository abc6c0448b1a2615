-- Shared prelude of the fair wait queue, prepended to the scripts that use it.
--
-- A primitive's wait queue is two keys:
--   queue      ZSET  member = waiter token, score = arrival time (server µs)
--   deadlines  HASH  waiter token -> server ms after which the waiter is presumed dead,
--                    optionally followed by ':' and what the primitive keeps of
--                    the waiter (a Lock: whether and how to hand the lock over)
-- A waiter refreshes its deadline every time it re-checks, so only a waiter that
-- died or gave up without cancelling is ever pruned. Each waiter blocks on its own
-- list, <signal prefix><token>; waking it is one RPUSH.

local function server_time()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- The first live waiter, its deadline and its whole deadlines entry, after
-- dropping dead ones from the front; false if none.
local function queue_head(queue, deadlines, now_ms)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return false
    end
    local entry = redis.call('HGET', deadlines, head) or '0'
    local deadline = tonumber(string.match(entry, '^%d+') or '0')
    if deadline >= now_ms then
      return head, deadline, entry
    end
    redis.call('ZREM', queue, head)
    redis.call('HDEL', deadlines, head)
  end
end

local function signal(sigprefix, token, ttl_ms)
  local key = sigprefix .. token
  if redis.call('LLEN', key) == 0 then
    redis.call('RPUSH', key, '1')
  end
  redis.call('PEXPIRE', key, math.max(ttl_ms, 1) + 1000)
end

local function wake_head(queue, deadlines, sigprefix, now_ms)
  local head, deadline = queue_head(queue, deadlines, now_ms)
  if head then
    signal(sigprefix, head, deadline - now_ms)
  end
  return head
end

local function enqueue(queue, deadlines, token, now_ms, now_us, waiter_ttl_ms, extra)
  redis.call('ZADD', queue, 'NX', now_us, token)
  redis.call('HSET', deadlines, token, string.format('%.0f', now_ms + waiter_ttl_ms) .. (extra or ''))
  local keep = waiter_ttl_ms + 1000
  if redis.call('PTTL', queue) < keep then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', deadlines, keep)
  end
end

local function dequeue(queue, deadlines, sigprefix, token)
  if redis.call('ZREM', queue, token) == 1 then
    redis.call('HDEL', deadlines, token)
    redis.call('DEL', sigprefix .. token)
    return true
  end
  return false
end

-- A waiter gives up: out of the queue and, when it was at the front (so it may
-- have been sent the wake-up), the wake-up passed on to the next live waiter.
-- Whether it was queued.
local function leave_queue(queue, deadlines, sigprefix, token)
  local was_head = redis.call('ZRANGE', queue, 0, 0)[1] == token
  if not dequeue(queue, deadlines, sigprefix, token) then
    return false
  end
  if was_head then
    local now_ms = server_time()
    wake_head(queue, deadlines, sigprefix, now_ms)
  end
  return true
end

-- Set the waiters flag of a held lock's value, so its release wakes the queue.
local function mark_waiters(lock)
  local value = redis.call('GET', lock)
  if value then
    local colon = string.find(value, ':', 1, true)
    if colon and string.sub(value, colon + 1, colon + 1) == '0' then
      redis.call('SET', lock, string.sub(value, 1, colon) .. '1' .. string.sub(value, colon + 2),
        'KEEPTTL')
    end
  end
end

-- Fencing tokens never go backwards, even when Redis restarted empty or a
-- replica took over. A name's counter only ever grows, so tokens increase
-- while it lives, whatever the clock does; and a grant finds it moved up to
-- the server clock in µs (when behind it) no longer than FENCE_SLACK_MS ago:
-- its TTL, set to FENCE_MEMORY_MS when it was last moved, tells how long ago
-- that was (a counter just (re)created by the INCR has none). So the clock
-- carries the order across a failover, when the counter is gone (a restart)
-- or stale (a replica that had not received the last grants), as long as the
-- new primary's clock is not behind the old one's and the failover took
-- longer than the slack, as every Sentinel and Cluster failover does. It is
-- forgotten FENCE_MEMORY after it was last moved, long after the clock has
-- passed any value it reached. An INCR and a PTTL; a TIME and a SET at most
-- once per FENCE_SLACK_MS of a name's use. fence_ttl_ms defaults to
-- FENCE_MEMORY_MS (scripts that still pass it get what they pass). The fast
-- paths of lock_acquire, semaphore_acquire and rwlock_acquire write it out.
local FENCE_MEMORY_MS = {{FENCE_MEMORY_MS}}
local FENCE_SLACK_MS = {{FENCE_SLACK_MS}}

local function next_fence(fence_key, fence_ttl_ms)
  local memory = fence_ttl_ms or FENCE_MEMORY_MS
  local fence = redis.call('INCR', fence_key)
  if redis.call('PTTL', fence_key) < memory - FENCE_SLACK_MS then
    local _, now_us = server_time()
    fence = math.max(fence, now_us)
    redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', memory)
  end
  return fence
end
