-- Shared prelude of the Lock scripts: the lock's value.
--
-- A held lock is one STRING key with a lease (PEXPIRE), so taking a free lock
-- is one SET NX PX. Its value:
--   <token>:<waiters>:<count>:<fence>:<lease_ms>:<since_ms>:<holder>
-- token    the holder's hex token          waiters  1 when the queue may be non-empty
-- count    reentrant hold count            fence    fencing token of this hold
-- lease_ms lease set by the last acquire or renewal
-- since_ms holder's wall clock at acquire (display only)
-- holder   host:pid:thread (display only; may contain ':'), then '\30handoff'
--          when the hold began as a handoff (_handoff.lua)

local function lock_value(token, waiters, count, fence, lease, since, holder)
  return token .. ':' .. waiters .. ':' .. count .. ':' .. string.format('%.0f', fence) .. ':'
    .. lease .. ':' .. since .. ':' .. holder
end

-- token, waiters, count, fence, lease, since, holder; nil when unparseable.
local function parse_lock(value)
  return string.match(value, '^(%x+):(%d):(%d+):(%d+):(%d+):(%d+):(.*)$')
end

-- The prefix of a Lock's per-waiter signal lists, from its lock key: the keys
-- are '<prefix>:{<name>}:lock' and '<prefix>:{<name>}:signal:<token>', so
-- they share a Redis Cluster slot (backend.key).
local function signal_prefix(lock)
  return string.sub(lock, 1, -5) .. 'signal:'
end

-- A Lock's other keys, named after its lock key ('<prefix>:{<name>}:lock'):
-- fence, queue, deadlines, stats (backend.key; one Redis Cluster slot). A
-- Lock passes only its lock key; Redlock passes its own keys, used as given.
local function lock_keys(lock)
  local base = string.sub(lock, 1, -5)
  return base .. 'fence', base .. 'queue', base .. 'deadlines', base .. 'stats'
end

-- Reset the lease of the Lock at `key` to `lease_ms` from now when `token`
-- holds it: 1 when extended, 0 when it is not (or no longer) `token`'s. The
-- one owner check of every extend and renewal (lock_extend, lock_renew).
local function extend_lock(key, token, lease_ms)
  local value = redis.call('GET', key)
  if not value then
    return 0
  end
  local owner, waiters, count, fence, _, since, holder = parse_lock(value)
  if owner ~= token then
    return 0
  end
  redis.call('SET', key, lock_value(owner, waiters, count, fence, lease_ms, since, holder),
    'PX', lease_ms)
  return 1
end

-- Ends the holder of a detached hold (lock_detach.lua), then the server's
-- clock (ms) at the detach: the hold waits for its adopter (lock_adopt.lua),
-- which writes its own holder. A control character, as HANDED_MARK.
local DETACHED_MARK = '\30detached@'
