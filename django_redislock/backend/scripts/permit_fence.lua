-- Take the fencing token of a Semaphore permit or ReadWriteLock hold that has
-- none yet: its first use.
-- KEYS[1] holders  ZSET   the primitive's holder ZSET (see _permits.lua)
-- KEYS[2] fence    STRING fencing counter of this name
-- ARGV[1] member   the holder's member as its holder knows it
-- The token comes from the same counter as an acquire's (next_fence in
-- _queue.lua), so it is larger than every token given out for the name
-- before. It is kept in the member, which is renamed from
-- "<token>:0:<tail>" to "<token>:<fence>:<tail>" with the same score (the
-- new member is added before the old one goes, so the key and its TTL stay):
-- asked again, the same token. A renewal sent under the old member finds the
-- new one by its token (renew_holder), so the watchdog may renew meanwhile.
-- Returns the fencing token (> 0), or 0 when the permit is not (or no longer)
-- live: a lost permit gets no token.
local set, fence_key, member = KEYS[1], KEYS[2], ARGV[1]
local token, tail = split_member(member)
local ends = redis.call('ZSCORE', set, member)
if not ends then
  member, ends = holder_of(set, token)
  if not member then
    return 0
  end
end
local fence = tonumber(string.match(member, '^[^:]*:(%d+):'))
if fence > 0 then
  return fence
end
if ends ~= 'inf' and tonumber(ends) <= server_time() then
  return 0
end
fence = next_fence(fence_key)
redis.call('ZADD', set, ends, holder_member(token, fence, tail))
redis.call('ZREM', set, member)
return fence
