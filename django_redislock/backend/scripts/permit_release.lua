-- Return a Semaphore permit or a ReadWriteLock hold, and wake whoever may go
-- next (wake_next in _permits.lua).
-- KEYS[1] holders ZSET (see _permits.lua)
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] member  the holder's (its limit, 0 for a ReadWriteLock, says which);
--                 one renamed since by its fencing token is found by its token
-- Returns 1 when released, 0 when the permit was not (or no longer) ARGV[1]'s
-- (its lease had ended, or it was cleared).
--
-- The common case, a sole holder and nobody waiting, comes first and reads no
-- clock. A holder taken on the fast path is scored +inf while it is alone and
-- nobody queued (see settle in _permits.lua): its lease is the key's TTL, so
-- finding it means the lease was live, and there is nobody to wake. Otherwise
-- a sole holder's lease is still the key's TTL (pin_ttl). These first steps are
-- give_back's (_permits.lua), written out before the preludes' closures.
local set, queue, member = KEYS[1], KEYS[2], ARGV[1]
local ends = redis.call('ZSCORE', set, member)
if ends == 'inf' then
  redis.call('DEL', set)  -- it holds only us
  return 1
end
if ends then
  redis.call('ZREM', set, member)
  if redis.call('EXISTS', set, queue) == 0 then
    return 1
  end
end

-- @preludes

if not ends then
  -- Not under this member: gone, or renamed by a fencing call whose reply
  -- never reached the holder (permit_fence.lua); found by its token then.
  local found, score = holder_of(set, string.match(member, '^[^:]*'))
  if score == 'inf' then
    redis.call('DEL', set)
    return 1
  end
  ends = score or false
  if found then
    member = found
    redis.call('ZREM', set, member)
  end
  if redis.call('EXISTS', set, queue) == 0 then
    return ends and 1 or 0
  end
end
return wake_next(set, queue, KEYS[3], member, ends)
