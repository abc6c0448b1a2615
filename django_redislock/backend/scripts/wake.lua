-- Wake a process's shared wake-up connection (engine/wakeups.py): its BLPOP
-- ends, and starts again with the signal lists of the waiters that joined it.
-- KEYS[1] control  LIST the wake-up connection's own control list
-- ARGV[1] ttl_ms        how long the list outlives a process that died before reading it
-- Returns the list's length.
local length = redis.call('RPUSH', KEYS[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return length
