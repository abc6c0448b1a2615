-- Release one level of a Lock held by ARGV[1]; wake the next waiter on the last.
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] deadlines
-- ARGV[1] token, ARGV[2] sigprefix
-- Returns the remaining hold count (0 when released), or -1 when not the owner.
local lock, queue, deadlines = KEYS[1], KEYS[2], KEYS[3]
local value = redis.call('GET', lock)
if not value then
  return -1
end
local owner, waiters, count, fence, lease, since, holder = parse_lock(value)
if owner ~= ARGV[1] then
  return -1
end
count = tonumber(count)
if count > 1 then
  redis.call('SET', lock, lock_value(owner, waiters, count - 1, fence, lease, since, holder),
    'KEEPTTL')
  return count - 1
end
redis.call('DEL', lock)
if waiters == '1' then
  local now_ms = server_time()
  wake_head(queue, deadlines, ARGV[2], now_ms)
end
return 0
