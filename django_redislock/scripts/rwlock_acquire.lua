-- Take a ReadWriteLock for reading or writing, fairly, in one round trip.
-- KEYS[1] rwlock    ZSET   holders (see _permits.lua); exists while held
-- KEYS[2] fence     STRING fencing counter of this name
-- KEYS[3] queue     ZSET   waiters in arrival order (server µs)
-- KEYS[4] deadlines HASH   waiter token -> presumed-dead time
-- ARGV[1] token          'r' or 'w' (the mode) followed by an unguessable hex token
-- ARGV[2] lease_ms       lease to set
-- ARGV[3] mode           "try": no queueing; "wait": queue on refusal
-- ARGV[4] waiter_ttl_ms  how long a queued waiter stays presumed alive without re-checking
-- ARGV[5] sigprefix      prefix of the per-waiter signal lists
-- ARGV[6] holder         host:pid:thread, for operators
-- ARGV[7] fence_ttl_ms   how long a fencing counter lives after it is (re)created
-- ARGV[8] since_ms       the holder's wall clock, for display only
-- Returns {1, fence} when granted (the holder's member is
-- "<token>:<fence>:0:<since_ms>:<holder>"); {0, retry_hint_ms} when refused.
-- An attempt for a token that holds it already is answered with that hold
-- (sending it again after a lost reply is safe).
--
-- Holders are all readers or one writer; the first character of each token
-- says which. A queued writer blocks readers that arrive after it, so a
-- stream of readers cannot starve it.
local set, fence_key, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, lease, sigprefix = ARGV[1], tonumber(ARGV[2]), ARGV[5]
local reading = string.sub(token, 1, 1) == 'r'

local now_ms, now_us = server_time()
redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)
local count = redis.call('ZCARD', set)
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
    -- Readers ahead of us go along with us; a writer ahead stops us.
    local front, ends = queue_front(queue, deadlines, now_ms, READER_BATCH)
    local blocked = false
    for i, waiter in ipairs(front) do
      if waiter == token then
        entitled = true
        break
      end
      if string.sub(waiter, 1, 1) == 'w' then
        if i == 1 and count == 0 then
          signal(sigprefix, waiter, ends[i] - now_ms)
        end
        blocked = true
        break
      end
      signal(sigprefix, waiter, ends[i] - now_ms)
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
  local fence = next_fence(fence_key, tonumber(ARGV[7]))
  add_holder(set, holder_member(token, fence, 0, ARGV[8], ARGV[6]), lease, now_ms, count == 0)
  return {1, fence}
end

local hint = tonumber(ARGV[4])
if count > 0 then
  hint = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2]) - now_ms
end
if ARGV[3] == 'wait' then
  enqueue(queue, deadlines, token, now_ms, now_us, tonumber(ARGV[4]), ':0:' .. ARGV[6])
end
return {0, hint}
