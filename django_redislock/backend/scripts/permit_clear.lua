-- Operator clear of a Semaphore or ReadWriteLock: drop every holder and wake
-- the front of the queue so waiters re-check at once. Holders learn of it at
-- their next renewal or release (LockLostError).
-- KEYS[1] holders   the primitive's holder ZSET
-- KEYS[2] queue
-- KEYS[3] deadlines
-- ARGV[1] sigprefix
-- ARGV[2] confirmed  '*': whoever holds it; else the comma-separated tokens of
--                    the holders the operator confirmed ('' for keys this
--                    version cannot read), and it is cleared only if exactly
--                    those are its live holders: checked here, in the clear,
--                    so a name that changed hands after the operator's last
--                    read is left to its new holders.
-- Returns how many live holders were dropped, or -1 when the live holders are
-- not the confirmed ones (nothing changed; 0 when none is left). Keys of
-- another type (written by hand) are deleted unread, the holders key counted
-- as one holder.
local now_ms = server_time()

-- The live holders' tokens as the operator tools read them (permit_describe
-- and state.parse_member); {''} when a key they read is of another type.
local function live_tokens()
  for i = 1, 2 do
    local found = redis.call('TYPE', KEYS[i]).ok
    if found ~= 'none' and found ~= 'zset' then
      return {''}
    end
  end
  local tokens = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms, '+inf')) do
    tokens[#tokens + 1] = string.match(member, '^[^:]*')
  end
  return tokens
end

if ARGV[2] ~= '*' then
  local live, confirmed, count = live_tokens(), {}, 0
  for token in string.gmatch(ARGV[2] .. ',', '([^,]*),') do
    confirmed[token] = true
    count = count + 1
  end
  if #live == 0 then
    return 0
  end
  if #live ~= count then
    return -1
  end
  for _, token in ipairs(live) do
    if not confirmed[token] then
      return -1
    end
  end
end

local odd = 0
for i, wanted in ipairs({'zset', 'zset', 'hash'}) do
  local found = redis.call('TYPE', KEYS[i]).ok
  if found ~= 'none' and found ~= wanted then
    redis.call('DEL', KEYS[i])
    if i == 1 then
      odd = 1
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
local wake = first and member_limit(first) or 0 -- a Semaphore's limit; 0 for a ReadWriteLock
if wake == 0 then
  wake = READER_BATCH
end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now_ms, '+inf') + odd
redis.call('DEL', KEYS[1])
wake_front(KEYS[2], KEYS[3], ARGV[1], now_ms, wake)
return live
