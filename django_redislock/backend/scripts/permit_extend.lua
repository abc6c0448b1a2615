-- Renew the lease of one holder of a Semaphore or ReadWriteLock.
-- KEYS[1] holders   the primitive's holder ZSET
-- ARGV[1] token     the holder's member (its token in the ZSET)
-- ARGV[2] lease_ms
-- Returns 1 when renewed, 0 when ARGV[1] no longer holds a live lease.
local now_ms = server_time()
if renew_holder(KEYS[1], ARGV[1], tonumber(ARGV[2]), now_ms) then
  return 1
end
return 0
