-- Shared prelude of the primitives with several holders (Semaphore, ReadWriteLock).
--
-- Their holders live in one ZSET, the primitive's main key, which exists
-- exactly while it is held:
--   member  "<token>:<fence>:<limit>:<since_ms>:<holder>"; fence 0 until the
--           holder takes its fencing token (permit_fence.lua renames it then)
--   score   server ms at which that holder's lease ends; +inf for a sole holder
--           taken on the fast path, whose lease is the key's TTL (see settle)
-- token    unguessable hex; a ReadWriteLock prefixes it with 'r' or 'w'
-- limit    a Semaphore's limit (every holder carries it), 0 for a ReadWriteLock
-- since_ms and holder (host:pid:thread, may contain ':') are for display only.
-- The key's TTL reaches the latest lease end, so a name whose holders all
-- died leaves nothing behind. While one holder is left, the TTL is exactly its
-- lease end (as a Lock's key is its lease): every script that leaves a single
-- holder pins it (pin_ttl), so a sole holder's release needs no clock (a key
-- that is still there holds a live lease).

-- How long a name's fencing counter lives after it is (re)created (see next_fence).
local FENCE_MEMORY_MS = {{FENCE_MEMORY_MS}}

-- The prefix of the per-waiter signal lists, '<prefix>:{<name>}:signal:', from
-- any key of the name (names are encoded without '}', so the last '}:' ends it).
local function signal_prefix(key)
  return string.match(key, '^(.*}:)') .. 'signal:'
end

-- A member's "<token>:<fence>:<tail>": token, tail.
local function split_member(member)
  local token, tail = string.match(member, '^([^:]*):[^:]*:(.*)$')
  return token, tail
end

-- The caller's limit and holder description, from the member's tail
-- ("<limit>:<since_ms>:<holder>").
local function tail_limit(tail)
  return tonumber(string.match(tail, '^(%d+):'))
end

local function tail_holder(tail)
  return string.match(tail, '^%d+:%d+:(.*)$')
end

-- How many queued readers one release (or arrival) wakes at most; the rest
-- are woken by later releases or their own bounded wait.
local READER_BATCH = 32

local function holder_member(token, fence, tail)
  return token .. ':' .. string.format('%.0f', fence) .. ':' .. tail
end

-- The limit a holder member carries.
local function member_limit(member)
  return tonumber(string.match(member, '^[^:]*:[^:]*:(%d+):'))
end

-- The member and score (a string, 'inf' for a fast-path sole holder) of the
-- holder with this token, if any. O(holders), and only where the name has
-- holders.
local function holder_of(set, token)
  local prefix = token .. ':'
  local all = redis.call('ZRANGE', set, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, #prefix) == prefix then
      return all[i], all[i + 1]
    end
  end
  return nil
end

-- The fencing token of the holder with this token, if any: an attempt sent
-- again after its first reply was lost (redis-py's retry policy) finds the
-- permit it was granted instead of taking a second one.
local function held_by(set, token)
  local member = holder_of(set, token)
  return member and tonumber(string.match(member, '^[^:]*:(%d+):'))
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
-- A sole holder's TTL follows its lease down as well as up. A member not
-- found is looked for by its token: one whose fencing token was taken since
-- the renewal was sent (permit_fence.lua renames it) is renewed all the same.
local function renew_holder(set, member, lease_ms, now_ms)
  local ends = redis.call('ZSCORE', set, member)
  if not ends then
    member, ends = holder_of(set, string.match(member, '^[^:]*'))
  end
  if ends == 'inf' then -- alone and unwaited for (see settle): the TTL is its lease
    redis.call('PEXPIRE', set, lease_ms)
    return true
  end
  if (not ends) or tonumber(ends) <= now_ms then
    return false
  end
  redis.call('ZADD', set, 'XX', now_ms + lease_ms, member)
  if redis.call('PTTL', set) < lease_ms or redis.call('ZCARD', set) == 1 then
    redis.call('PEXPIRE', set, lease_ms)
  end
  return true
end

-- Make the key expire when its only holder's lease ends; called (with one
-- holder left) wherever a script may have left it behind a longer TTL.
local function pin_ttl(set)
  local only = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if only[2] and only[2] ~= 'inf' then
    redis.call('PEXPIREAT', set, only[2])
  end
end

-- The fast acquire reads no clock for the lease: it scores its sole holder +inf and sets the
-- key's TTL to the lease. Only a holder that is alone, with nobody queued, is
-- ever scored +inf, so its release can skip both checks. Every acquire that
-- finds one holder (before it joins it, queues behind it or reads its score)
-- writes that lease end out as a score, from the TTL.
local function settle(set, now_ms)
  local only = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if only[2] == 'inf' then
    redis.call('ZADD', set, 'XX', now_ms + redis.call('PTTL', set), only[1])
  end
end

-- Drop the holders whose lease ended; how many are left. changed: the caller
-- removed a holder itself, so the TTL may need pinning even if none ended.
local function prune(set, now_ms, changed)
  local dropped = redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)
  local count = redis.call('ZCARD', set)
  if count == 1 and (changed or dropped > 0) then
    pin_ttl(set)
  end
  return count
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

-- After a holder's permit is taken out of the set (ends: its score, false
-- when it held none): drop ended leases and wake whoever may go next. For a
-- Semaphore the waiters entitled to the free permits; for a ReadWriteLock the
-- readers at the front of the queue, or the writer at its head once nobody
-- holds. 1 when the permit was live, else 0.
local function wake_next(set, queue, deadlines, member, ends)
  local now_ms = server_time()
  local ours = ends ~= false and tonumber(ends) > now_ms
  local count = prune(set, now_ms, ends ~= false)
  if redis.call('EXISTS', queue) == 0 then
    return ours and 1 or 0
  end
  local sigprefix = signal_prefix(queue)
  local limit = member_limit(member)
  if limit > 0 then
    local free = limit - count
    if free > 0 then
      wake_front(queue, deadlines, sigprefix, now_ms, free)
    end
  else
    local first = redis.call('ZRANGE', set, 0, 0)[1]
    if not (first and string.sub(first, 1, 1) == 'w') then
      local front, dues = queue_front(queue, deadlines, now_ms, READER_BATCH)
      for i, waiter in ipairs(front) do
        if string.sub(waiter, 1, 1) == 'w' then
          if i == 1 and not first then
            signal(sigprefix, waiter, dues[i] - now_ms)
          end
          break
        end
        signal(sigprefix, waiter, dues[i] - now_ms)
      end
    end
  end
  return ours and 1 or 0
end

-- Take a holder's permit back and wake whoever may go next (wake_next); ends:
-- its score, false when it holds none. permit_release.lua writes these first
-- steps out before the preludes, as its fast path.
local function give_back(set, queue, deadlines, member, ends)
  if ends == 'inf' then
    redis.call('DEL', set)  -- alone and unwaited for (see settle)
    return 1
  end
  if ends then
    redis.call('ZREM', set, member)
  end
  if redis.call('EXISTS', set, queue) == 0 then
    return ends and 1 or 0
  end
  return wake_next(set, queue, deadlines, member, ends)
end
