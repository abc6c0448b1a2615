-- A permit primitive's common case, nobody holding and nobody waiting (neither
-- the holders' set nor the queue exists: Redis drops an empty ZSET), written
-- out in full before the preludes (add_holder inlined; any limit >= 1 has
-- room). The sole holder is scored +inf, its lease being the key's TTL (see
-- settle in _permits.lua). ARGV[1] is the member as it stands with no fencing
-- token ("<token>:0:<tail>"), so an unfenced grant writes it unread: no clock,
-- no counter, no string built. Shared by semaphore_acquire and rwlock_acquire.
if redis.call('EXISTS', set, queue) == 0 then
  if ARGV[4] == '1' then
    -- @include _fence_inline.lua
    local cut = string.find(ARGV[1], ':', 1, true)
    redis.call('ZADD', set, '+inf',
      string.sub(ARGV[1], 1, cut) .. string.format('%.0f', fence) .. string.sub(ARGV[1], cut + 2))
    redis.call('PEXPIRE', set, ARGV[2])
    return fence
  end
  redis.call('ZADD', set, '+inf', ARGV[1])
  redis.call('PEXPIRE', set, ARGV[2])
  return 0
end
