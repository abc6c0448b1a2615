-- Store or drop an idempotency key's record, if it is still ARGV[1]'s attempt
-- (a lease lost under a stalled attempt lets a retry take over the record).
-- KEYS[1] record    HASH the key's attempt or stored response (once/store.py)
-- ARGV[1] owner         the attempt's token
-- ARGV[2] ttl_ms        how long the stored response lives; 0 drops the record
-- ARGV[3] fields        the stored response's fields and values, alternating (optional)
-- Returns 1 when stored or dropped, 0 when the record is another attempt's or gone.
if redis.call("HGET", KEYS[1], "owner") ~= ARGV[1] then
  return 0
end
redis.call("DEL", KEYS[1])
if ARGV[2] == "0" then
  return 1
end
for i = 3, #ARGV, 2 do
  redis.call("HSET", KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call("PEXPIRE", KEYS[1], ARGV[2])
return 1
