-- Release one level of a Lock held by ARGV[1]; on the last, hand the lock to the
-- first live waiter (_handoff.lua) or free it. The holder's depth decides which
-- level is the last, not the count in the value: that count can be one off
-- when Redis ran a nested acquire or a release whose reply the client never
-- got (it gave up, or the connection broke), and the lock must neither stay
-- held after the holder's last release nor be freed before it.
-- KEYS[1] lock       STRING the holder's value (_lock_value.lua)
-- KEYS[2] queue      ZSET   waiters in arrival order; optional: derived from the lock key when left out
-- KEYS[3] deadlines  HASH   waiter token -> presumed-dead time; optional, as queue
-- KEYS[4] fence      STRING fencing counter of this name; optional, as queue
-- ARGV[1] token          the holder's token
-- ARGV[2] final          optional: '1' on the holder's last level, which frees the lock (or
--                        hands it on) whatever count the value holds; left out on an inner
--                        level, which never frees it (at count 1 it stays held at 1)
-- KEYS[2..4] are used only when the lock has waiters. Signal lists
-- are KEYS[1] with its final 'lock' replaced by 'signal:' and a token.
-- Returns the remaining hold count (0 when released), or -1 when not the owner.
local lock, token = KEYS[1], ARGV[1]
local value = redis.call('GET', lock)
if not value then
  return -1
end
-- The value starts '<token>:<waiters>:<count>:' (_lock_value.lua); tokens are hex.
local final = ARGV[2] == '1'
-- The common case, before the preludes' closures: the last level, nobody
-- waiting (one compare: the owner and the waiters flag at once).
if final and string.sub(value, 1, #token + 3) == token .. ':0:' then
  redis.call('DEL', lock)
  return 0
end
local mine = #token + 1
if string.sub(value, 1, mine) ~= token .. ':' then
  return -1
end

-- @preludes

local owner, waiters, count, fence, lease, since, holder = parse_lock(value)
count = tonumber(count)
if not final then
  if count <= 1 then  -- the holder says more levels remain: one release was counted twice
    return 1
  end
  redis.call('SET', lock, lock_value(owner, waiters, count - 1, fence, lease, since, holder),
    'KEEPTTL')
  return count - 1
end
if waiters == '1' then
  local queue, deadlines, fence_key = KEYS[2], KEYS[3], KEYS[4]
  if not queue then
    fence_key, queue, deadlines = lock_keys(lock)
  end
  pass_on(lock, queue, deadlines, fence_key, signal_prefix(lock))
  return 0
end
redis.call('DEL', lock)
return 0
