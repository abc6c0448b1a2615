-- Shared prelude: per-name usage counters (REDISLOCK['STATS']).
--
-- stats  HASH  acquired   successful (outermost) acquires
--              contended  acquire calls that found the primitive taken (counted once per call)
--              wait_ms    total time acquirers that had to wait spent waiting
--              lost       leases their holders found lost (counted by the client, rarely)
-- Only 'contended' is counted here, by the acquire script, on a call's first
-- refusal, so that counting costs no extra round trip. 'acquired' and
-- 'wait_ms' are on every acquire's path, so the client counts them, batched
-- (holds/counters.py): an HINCRBY in the acquire script was a sixth of an
-- uncontended lock's Redis time.
-- The hash expires ttl_ms after its last TTL refresh, so idle names leave
-- nothing behind. The TTL is refreshed when the hash is created and then on
-- every 64th update here, and on every batched write.

local STATS_REFRESH_EVERY = 64

local function refresh(stats, ttl_ms, n)
  if n % STATS_REFRESH_EVERY == 1 then
    redis.call('PEXPIRE', stats, ttl_ms)
  end
end

-- stats: the key (nil when a caller passes none); ttl_ms: 0 when counting is off;
-- waited_ms: -1 on a call's first attempt, else milliseconds waited so far.
local function count_contention(stats, ttl_ms, waited_ms)
  ttl_ms = tonumber(ttl_ms or '0')
  if not stats or ttl_ms <= 0 or tonumber(waited_ms or '-1') >= 0 then
    return
  end
  refresh(stats, ttl_ms, redis.call('HINCRBY', stats, 'contended', 1))
end
