-- A task with a key starts: its run takes the claim, leased, or releases it.
-- KEYS[1] claim     HASH (once_claim.lua)
-- ARGV[1] run           the run's token (renewals and the release compare it)
-- ARGV[2] id            the running task's id ("": keep the one the enqueue recorded)
-- ARGV[3] task          the task's name
-- ARGV[4] since_ms      now, by the worker's clock
-- ARGV[5] lease_ms      how long the claim lasts unless renewed; 0 releases it now
-- Returns 1.
if ARGV[5] == "0" then
  redis.call("DEL", KEYS[1])
  return 1
end
redis.call("HSET", KEYS[1], "run", ARGV[1], "task", ARGV[3], "state", "running",
  "since", ARGV[4])
if redis.call("HEXISTS", KEYS[1], "token") == 0 then
  redis.call("HSET", KEYS[1], "token", ARGV[1])  -- a run nobody enqueued once: its own
end
if ARGV[2] ~= "" then
  redis.call("HSET", KEYS[1], "id", ARGV[2])
end
redis.call("PEXPIRE", KEYS[1], ARGV[5])
return 1
