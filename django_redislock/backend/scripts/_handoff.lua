-- Shared prelude of the Lock scripts: passing a lock on when its holder lets go.
--
-- A Lock waiter's deadlines entry is '<deadline_ms>:<grant_ms>:<holder>'. The
-- releasing script makes the first live waiter the owner at once, for a short
-- first lease of grant_ms, and pushes the fencing token to its signal list:
-- the waiter wakes up holding the lock, with no acquire round trip of its own,
-- and its watchdog renews the full lease. (A waiter without a watchdog re-runs
-- the acquire script, which finds the lock already its own and sets the full
-- lease.) A waiter that died in line costs at most grant_ms, which is no more
-- than it would have blocked the queue anyway (grant_ms <= its re-check span).
-- An entry without grant_ms (an older client) is woken to take the lock itself.
-- The handed-over value's holder ends with HANDED_MARK (a control character,
-- which a holder description never holds: context.clean), kept by every
-- renewal, so the operator tools can tell a hold that began as a handoff
-- (state.parse_lock_value strips it).
local HANDED_MARK = '\30handoff'

-- Free `lock`, or hand it to the first live waiter (who counts the acquire: holds/counters.py).
local function pass_on(lock, queue, deadlines, fence_key, sigprefix)
  local now_ms = server_time()
  local head, deadline, entry = queue_head(queue, deadlines, now_ms)
  if not head then
    redis.call('DEL', lock)
    return
  end
  local grant_ms, holder = string.match(entry, '^%d+:(%d+):(.*)$')
  grant_ms = tonumber(grant_ms or '0')
  if grant_ms <= 0 then
    redis.call('DEL', lock)
    signal(sigprefix, head, deadline - now_ms)
    return
  end
  redis.call('ZREM', queue, head)
  redis.call('HDEL', deadlines, head)
  local fence = next_fence(fence_key)
  local waiters = redis.call('EXISTS', queue)
  redis.call('SET', lock,
    lock_value(head, waiters, 1, fence, grant_ms, now_ms, holder .. HANDED_MARK), 'PX', grant_ms)
  local key = sigprefix .. head
  redis.call('DEL', key)
  redis.call('RPUSH', key, string.format('%.0f', fence))
  redis.call('PEXPIRE', key, grant_ms + 1000)
end
