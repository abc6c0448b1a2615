-- An operator clears Locks (manage.py locks clear, the admin's force-release):
-- delete each, and wake its first waiter as a release would, so the queue
-- moves on at once. A holder learns of it at its next renewal or release,
-- which find the lease gone (LockLostError, lock_lost).
-- Per name: these KEYS and ARGV for the first name, then the next name's, so
-- the i-th name (1-based) has KEYS[3i-2] lock, KEYS[3i-1] queue, KEYS[3i]
-- deadlines and ARGV[i] confirmed. Its signal lists' prefix is derived from
-- its lock key (signal_prefix in _lock_value.lua), as the other Lock scripts do.
-- KEYS[1] lock
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] confirmed  '*': whoever holds it; else the token of the holder the
--                    operator confirmed ('' for a value this version cannot
--                    read), and the lock is cleared only if that holder still
--                    holds it: checked here, in the clear, so a lock that
--                    changed hands after the operator's last read is left to
--                    its new holder.
-- One name per call on Redis Cluster (its keys share a slot); up to a hundred
-- elsewhere, each O(1) apart from the wake-up.
-- Returns {result_1, result_2, ...}: 1 when that name's lock was deleted, 0
-- when it was not held, -1 when it is held by another than the confirmed
-- holder (nothing changed).

-- The holder's token as the operator tools read it (state.parse_lock_value):
-- '' for a value they cannot read, or a key of another type.
local function held_token(value)
  local token, count, fence, lease, since =
    string.match(value, '^([^:]*):[^:]*:([^:]*):([^:]*):([^:]*):([^:]*):')
  if not token then
    return ''
  end
  for _, n in ipairs({count, fence, lease, since}) do
    if #n > 19 or not string.match(n, '^%d+$') then
      return ''
    end
  end
  return token
end

local out = {}
local now_ms
for i = 1, #KEYS / 3 do
  local lock, queue, deadlines = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local confirmed = ARGV[i]
  local found = true
  if confirmed ~= '*' then
    local value = redis.pcall('GET', lock)
    if type(value) == 'table' then -- a key of another type, written by hand
      value = ''
    end
    found = value and held_token(value) == confirmed
    out[i] = value and -1 or 0
  end
  if found then
    out[i] = redis.call('DEL', lock)
    if redis.call('EXISTS', queue) == 1 then
      now_ms = now_ms or server_time()
      wake_head(queue, deadlines, signal_prefix(lock), now_ms)
    end
  end
end
return out
