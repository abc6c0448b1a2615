-- Shared prelude of the primitives with several holders (Semaphore, ReadWriteLock).
--
-- Their holders live in one ZSET, the primitive's main key, which exists
-- exactly while it is held:
--   member  "<token>:<fence>:<limit>:<since_ms>:<holder>"
--   score   server ms at which that holder's lease ends
-- token    unguessable hex; a ReadWriteLock prefixes it with 'r' or 'w'
-- limit    a Semaphore's limit (every holder carries it), 0 for a ReadWriteLock
-- since_ms and holder (host:pid:thread, may contain ':') are for display only.
-- The key's TTL reaches the latest lease end, so a name whose holders all
-- died leaves nothing behind.

-- How many queued readers one release (or arrival) wakes at most; the rest
-- are woken by later releases or their own bounded wait.
local READER_BATCH = 32

local function holder_member(token, fence, limit, since, holder)
  return token .. ':' .. string.format('%.0f', fence) .. ':' .. limit .. ':' .. since .. ':'
    .. holder
end

-- The limit a holder member carries.
local function member_limit(member)
  return tonumber(string.match(member, '^[^:]*:[^:]*:(%d+):'))
end

-- The fencing token of the live holder with this token, if any: an attempt
-- sent again after its first reply was lost (redis-py's retry policy) finds
-- the permit it was granted instead of taking a second one. O(holders), and
-- only where the name has holders.
local function held_by(set, token)
  local prefix = token .. ':'
  for _, member in ipairs(redis.call('ZRANGE', set, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then
      return tonumber(string.match(member, '^[^:]*:(%d+):'))
    end
  end
  return nil
end

-- Add a holder and stretch the key's TTL to cover its lease. fresh: the key
-- did not exist, so it has no TTL yet.
local function add_holder(set, member, lease_ms, now_ms, fresh)
  redis.call('ZADD', set, now_ms + lease_ms, member)
  if fresh or redis.call('PTTL', set) < lease_ms then
    redis.call('PEXPIRE', set, lease_ms)
  end
end

-- Renew a holder's lease; false when it is not (or no longer) a live holder.
local function renew_holder(set, member, lease_ms, now_ms)
  local ends = redis.call('ZSCORE', set, member)
  if (not ends) or tonumber(ends) <= now_ms then
    return false
  end
  redis.call('ZADD', set, 'XX', now_ms + lease_ms, member)
  if redis.call('PTTL', set) < lease_ms then
    redis.call('PEXPIRE', set, lease_ms)
  end
  return true
end

-- Drop the holders whose lease ended, then this one; true when its lease was live.
local function remove_holder(set, member, now_ms)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)
  return redis.call('ZREM', set, member) == 1
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
      local entry = redis.call('HGET', deadlines, waiter) or '0'
      local deadline = tonumber(string.match(entry, '^%d+') or '0')
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

-- Wake the first n live waiters.
local function wake_front(queue, deadlines, sigprefix, now_ms, n)
  local front, ends = queue_front(queue, deadlines, now_ms, n)
  for i, waiter in ipairs(front) do
    signal(sigprefix, waiter, ends[i] - now_ms)
  end
  return #front
end
