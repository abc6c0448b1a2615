-- A running task sends its own retry: its claim goes back to queued, for the retry.
-- KEYS[1] claim     HASH (once_claim.lua)
-- ARGV[1] run           the running task's token (once_start.lua)
-- ARGV[2] token         the retry's enqueue token (a send that fails releases it by this)
-- ARGV[3] since_ms      now, by the worker's clock
-- ARGV[4] ttl_ms        how long the claim lasts if the retry never starts
-- Returns 1 when requeued, 0 when the claim is gone or another run's.
if redis.call("HGET", KEYS[1], "run") ~= ARGV[1] then
  return 0
end
redis.call("HDEL", KEYS[1], "run")
redis.call("HSET", KEYS[1], "token", ARGV[2], "state", "queued", "since", ARGV[3])
redis.call("PEXPIRE", KEYS[1], ARGV[4])
return 1
