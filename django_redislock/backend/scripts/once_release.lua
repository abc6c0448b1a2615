-- Release a claim, if it is still the caller's.
-- KEYS[1] claim     HASH (once_claim.lua)
-- ARGV[1] field         "run" (a run that ended) or "token" (an enqueue that failed)
-- ARGV[2] value         the caller's token
-- Returns 1 when released, 0 when the claim is gone or another's.
if redis.call("HGET", KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call("DEL", KEYS[1])
return 1
