-- Reset the lease of a Lock held by ARGV[1] to ARGV[2] ms from now.
-- KEYS[1] lock      STRING the holder's value (_lock_value.lua)
-- ARGV[1] token         the holder's token
-- ARGV[2] lease_ms      the new lease
-- Returns 1 when extended, 0 when the lock is not (or no longer) ARGV[1]'s.
return extend_lock(KEYS[1], ARGV[1], ARGV[2])
