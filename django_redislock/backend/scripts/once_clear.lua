-- An operator clears an idempotency record or an enqueue-once claim.
-- KEYS[1] record    HASH the record (once/store.py) or the claim (once_claim.lua)
-- ARGV[1] field         the field that names its holder: "owner" or "token"
-- ARGV[2] confirmed     the holder the operator was shown, or "*" for whoever
-- Returns 1 when cleared, 0 when absent, -1 when another holder has it now.
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
if ARGV[2] ~= "*" and redis.call("HGET", KEYS[1], ARGV[1]) ~= ARGV[2] then
  return -1
end
redis.call("DEL", KEYS[1])
return 1
