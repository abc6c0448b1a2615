-- Renew the lease of a running task's claim.
-- KEYS[1] claim     HASH (once_claim.lua)
-- ARGV[1] run           the run's token
-- ARGV[2] lease_ms      the lease from now
-- Returns 1 when renewed, 0 when the claim is gone or another run's.
if redis.call("HGET", KEYS[1], "run") ~= ARGV[1] then
  return 0
end
redis.call("PEXPIRE", KEYS[1], ARGV[2])
return 1
