-- Take a Semaphore permit, fairly, in one round trip.
-- KEYS[1] semaphore ZSET   holder token -> server ms its lease ends (exists while held)
-- KEYS[2] holders   HASH   holder token -> "<fence>:<since_ms>:<holder>"
-- KEYS[3] limit     STRING the limit every user of this name agreed on
-- KEYS[4] fence     STRING fencing counter of this name
-- KEYS[5] queue     ZSET   waiters in arrival order (server µs)
-- KEYS[6] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] token          the would-be holder's unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on refusal
-- ARGV[4] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[5] sigprefix      prefix of the per-waiter signal lists
-- ARGV[6] holder         host:pid:thread, for operators
-- ARGV[7] fence_ttl_ms   how long a fencing counter lives after it is (re)created
-- ARGV[8] since_ms       the holder's wall clock, for display only (never for ordering)
-- ARGV[9] limit          the caller's limit
-- Returns {1, fence} when granted; {0, retry_hint_ms} when refused;
-- {-2, stored_limit} when the name is in use with another limit.
local set, info, limit_key, fence_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue, deadlines = KEYS[5], KEYS[6]
local token, lease = ARGV[1], tonumber(ARGV[2])
local limit = tonumber(ARGV[9])

local stored = redis.call('GET', limit_key)
if stored and tonumber(stored) ~= limit then
  return {-2, tonumber(stored)}
end

local now_ms, now_us = server_time()
local free = limit - prune_holders(set, info, now_ms)
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
        signal(ARGV[5], waiter, ends[i] - now_ms)
      end
    end
    if entitled then
      dequeue(queue, deadlines, ARGV[5], token)
    elseif #front < free then
      entitled = true -- fewer waiters than free permits: nobody is passed over
    end
    hint = tonumber(ARGV[4])
  end
  if entitled then
    local fence = next_fence(fence_key, tonumber(ARGV[7]))
    add_holder(set, info, token, lease, now_ms, fence, ARGV[8], ARGV[6])
    if (not stored) or redis.call('PTTL', limit_key) < lease then
      redis.call('SET', limit_key, limit, 'PX', lease)
    end
    return {1, fence}
  end
else
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  hint = tonumber(first[2]) - now_ms
end
if ARGV[3] == 'wait' then
  local waiter_ttl = tonumber(ARGV[4])
  enqueue(queue, deadlines, token, now_ms, now_us, waiter_ttl)
  if redis.call('PTTL', limit_key) < waiter_ttl + 1000 then
    redis.call('SET', limit_key, limit, 'PX', waiter_ttl + 1000)
  end
end
return {0, hint}
