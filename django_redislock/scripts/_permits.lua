-- Shared prelude of the primitives with several holders (Semaphore, ReadWriteLock).
--
-- Their holders are two keys:
--   set   ZSET  member = holder token, score = server ms at which its lease ends
--   info  HASH  holder token -> "<fence>:<since_ms>:<holder>" (display only)
-- Both get a TTL reaching the latest lease end, so an idle name leaves nothing
-- behind even when every holder died.

-- Drop holders whose lease ended; returns how many holders remain.
local function prune_holders(set, info, now_ms)
  local expired = redis.call('ZRANGEBYSCORE', set, '-inf', now_ms)
  if #expired > 0 then
    redis.call('ZREM', set, unpack(expired))
    redis.call('HDEL', info, unpack(expired))
  end
  return redis.call('ZCARD', set)
end

-- Up to n live waiters from the front of the queue, dropping dead ones.
-- Returns {token, ...}, {deadline_ms, ...}.
local function queue_front(queue, deadlines, now_ms, n)
  local live, ends = {}, {}
  local start = 0
  while #live < n do
    local batch = redis.call('ZRANGE', queue, start, start + (n - #live) - 1)
    if #batch == 0 then
      break
    end
    local dead = {}
    for _, waiter in ipairs(batch) do
      local deadline = tonumber(redis.call('HGET', deadlines, waiter) or '0')
      if deadline >= now_ms then
        live[#live + 1] = waiter
        ends[#ends + 1] = deadline
        start = start + 1
      else
        dead[#dead + 1] = waiter
      end
    end
    if #dead > 0 then
      redis.call('ZREM', queue, unpack(dead))
      redis.call('HDEL', deadlines, unpack(dead))
    end
  end
  return live, ends
end

-- Add a holder with a lease of lease_ms and stretch the keys' TTL to cover it.
local function add_holder(set, info, token, lease_ms, now_ms, fence, since, holder)
  redis.call('ZADD', set, now_ms + lease_ms, token)
  redis.call('HSET', info, token, string.format('%.0f', fence) .. ':' .. since .. ':' .. holder)
  if redis.call('PTTL', set) < lease_ms then
    redis.call('PEXPIRE', set, lease_ms)
    redis.call('PEXPIRE', info, lease_ms)
  end
end

-- Renew a holder's lease; false when it is not (or no longer) a holder.
local function renew_holder(set, info, token, lease_ms, now_ms)
  local ends = redis.call('ZSCORE', set, token)
  if (not ends) or tonumber(ends) <= now_ms then
    return false
  end
  redis.call('ZADD', set, 'XX', now_ms + lease_ms, token)
  if redis.call('PTTL', set) < lease_ms then
    redis.call('PEXPIRE', set, lease_ms)
    redis.call('PEXPIRE', info, lease_ms)
  end
  return true
end

-- Remove a holder; true when it still held a live lease.
local function remove_holder(set, info, token, now_ms)
  local ends = redis.call('ZSCORE', set, token)
  if not ends then
    return false
  end
  redis.call('ZREM', set, token)
  redis.call('HDEL', info, token)
  return tonumber(ends) > now_ms
end

-- How many queued readers one release (or arrival) wakes at most; the rest
-- are woken by later releases or their own bounded wait.
local READER_BATCH = 32
