-- Claim a key for one enqueued task, unless a task has it (queued or running).
-- KEYS[1] claim     HASH token, id, task, state (queued or running), since, run (once/claims.py)
-- ARGV[1] token         this enqueue's token
-- ARGV[2] id            the task's id ("" until the backend gives one: once_bind.lua)
-- ARGV[3] task          the task's name
-- ARGV[4] since_ms      now, by the enqueuer's clock
-- ARGV[5] ttl_ms        how long a claim whose task never starts lasts
-- Returns {} when claimed, else the claim's {id, state, since_ms, task}.
if redis.call("EXISTS", KEYS[1]) == 1 then
  return redis.call("HMGET", KEYS[1], "id", "state", "since", "task")
end
redis.call("HSET", KEYS[1], "token", ARGV[1], "id", ARGV[2], "task", ARGV[3],
  "state", "queued", "since", ARGV[4])
redis.call("PEXPIRE", KEYS[1], ARGV[5])
return {}
