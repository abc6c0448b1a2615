-- Read the live holders of a Semaphore or ReadWriteLock (read only).
-- KEYS[1] holders   the primitive's holder ZSET
-- KEYS[2] queue
-- Returns {waiters, member1, ms_left1, member2, ms_left2, ...}; holders whose
-- lease has ended are left out. A sole holder scored +inf has the key's TTL left.
local now_ms = server_time()
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '+inf', 'WITHSCORES')
local out = {redis.call('ZCARD', KEYS[2])}
for i = 1, #rows, 2 do
  out[#out + 1] = rows[i]
  if rows[i + 1] == 'inf' then
    out[#out + 1] = redis.call('PTTL', KEYS[1])
  else
    out[#out + 1] = tonumber(rows[i + 1]) - now_ms
  end
end
return out
