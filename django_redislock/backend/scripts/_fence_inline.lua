-- next_fence (_queue.lua) written out, for the fast paths that run before the
-- preludes: the grant's fencing token in `fence`, from `fence_key`. An INCR and
-- a PTTL; a TIME and a SET when the counter was (re)created, or last moved up
-- to the clock over FENCE_SLACK_MS ago.
local fence = redis.call('INCR', fence_key)
if redis.call('PTTL', fence_key) < {{FENCE_MEMORY_MS}} - {{FENCE_SLACK_MS}} then
  local now = redis.call('TIME')
  fence = math.max(fence, tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call('SET', fence_key, string.format('%.0f', fence), 'PX', {{FENCE_MEMORY_MS}})
end
