-- Take a Semaphore permit, fairly, in one round trip.
-- KEYS[1] semaphore ZSET   holders (see _permits.lua); exists while held
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order (server µs)
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] token          the would-be holder's unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on refusal
-- ARGV[4] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[5] sigprefix      prefix of the per-waiter signal lists
-- ARGV[6] holder         host:pid:thread, for operators
-- ARGV[7] fence_ttl_ms   how long a fencing counter lives after it is (re)created
-- ARGV[8] since_ms       the holder's wall clock, for display only (never for ordering)
-- ARGV[9] limit          the caller's limit
-- An attempt for a token that holds a permit already is answered with that
-- permit (sending it again after a lost reply is safe).
-- Returns {1, fence} when granted (the holder's member is
-- "<token>:<fence>:<limit>:<since_ms>:<holder>"); {0, retry_hint_ms} when
-- refused; {-2, limit_in_use} when the name is held under another limit. The
-- fast path answers a grant with the bare fence (> 0), which is quicker to parse.
--
-- The common case, no holder and nobody waiting, comes first and is written
-- out in full (next_fence, holder_member and add_holder inlined): it runs
-- before the preludes and pays for none of their closures.
local set, fence_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, lease, sigprefix = ARGV[1], tonumber(ARGV[2]), ARGV[5]
local limit = tonumber(ARGV[9])
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- (No holders and no queue: neither key exists; Redis drops an empty ZSET.)
if redis.call('EXISTS', set, queue) == 0 then
  local fence = redis.call('INCR', fence_key)
  if fence == 1 then  -- (re)created: start at the server clock, as next_fence does
    fence = now_us
    redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', ARGV[7])
  end
  redis.call('ZADD', set, now_ms + lease,
    token .. ':' .. string.format('%.0f', fence) .. ':' .. limit .. ':' .. ARGV[8] .. ':' .. ARGV[6])
  redis.call('PEXPIRE', set, lease)
  return fence
end

-- @preludes

redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)
local count = redis.call('ZCARD', set)
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
local hint
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
    hint = tonumber(ARGV[4])
  end
  if entitled then
    local fence = next_fence(fence_key, tonumber(ARGV[7]))
    add_holder(set, holder_member(token, fence, limit, ARGV[8], ARGV[6]), lease, now_ms,
      count == 0)
    return {1, fence}
  end
else
  hint = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2]) - now_ms
end
if ARGV[3] == 'wait' then
  enqueue(queue, deadlines, token, now_ms, now_us, tonumber(ARGV[4]), ':0:' .. ARGV[6])
end
return {0, hint}
