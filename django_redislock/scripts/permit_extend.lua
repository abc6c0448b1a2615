-- Renew the lease of one holder of a Semaphore or ReadWriteLock.
-- KEYS[1] holder set (ZSET), KEYS[2] holder info (HASH), KEYS[3..] keys that
-- must live at least as long as the holders (a Semaphore's limit)
-- ARGV[1] token, ARGV[2] lease_ms
-- Returns 1 when renewed, 0 when ARGV[1] no longer holds a live lease.
local lease = tonumber(ARGV[2])
local now_ms = server_time()
if not renew_holder(KEYS[1], KEYS[2], ARGV[1], lease, now_ms) then
  return 0
end
for i = 3, #KEYS do
  if redis.call('PTTL', KEYS[i]) < lease then
    redis.call('PEXPIRE', KEYS[i], lease)
  end
end
return 1
