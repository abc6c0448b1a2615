-- Read the live holders of a Semaphore or ReadWriteLock (read only).
-- KEYS[1] holder set (ZSET), KEYS[2] holder info (HASH), KEYS[3] queue, KEYS[4] limit
-- Returns {waiters, limit or -1, token1, ms_left1, info1, token2, ...}; holders
-- whose lease has ended are left out.
local now_ms = server_time()
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '+inf', 'WITHSCORES')
local limit = redis.call('GET', KEYS[4])
local out = {redis.call('ZCARD', KEYS[3]), tonumber(limit or '-1')}
for i = 1, #rows, 2 do
  out[#out + 1] = rows[i]
  out[#out + 1] = tonumber(rows[i + 1]) - now_ms
  out[#out + 1] = redis.call('HGET', KEYS[2], rows[i]) or ''
end
return out
