-- Record the task id of a claim made before the backend gave one.
-- KEYS[1] claim     HASH (once_claim.lua)
-- ARGV[1] token         the enqueue's token
-- ARGV[2] id            the task's id
-- Returns 1 when recorded, 0 when the claim is gone, another's, or its task started.
if redis.call("HGET", KEYS[1], "token") ~= ARGV[1] then
  return 0
end
if redis.call("HGET", KEYS[1], "state") ~= "queued" then
  return 0
end
redis.call("HSET", KEYS[1], "id", ARGV[2])
return 1
