-- Renew many Semaphore or ReadWriteLock holders' leases at once (the watchdog's batch).
-- KEYS[1] holders   the first holder's primitive's ZSET; KEYS[i] the i-th's (may repeat)
-- ARGV[1] lease_ms  the new lease of every one
-- ARGV[2] token     KEYS[1]'s holder's member; ARGV[1 + i] KEYS[i]'s
-- On Redis Cluster every key of one call is in one hash slot.
-- Returns the renewals that did not happen, as pairs {i, 0} when ARGV[1 + i]
-- no longer holds a live lease, {i, text} when its command failed (a key of
-- another type); an empty array when every lease was renewed.
local now_ms = server_time()
local lease = tonumber(ARGV[1])
local failed = {}
for i, key in ipairs(KEYS) do
  local ok, renewed = pcall(renew_holder, key, ARGV[i + 1], lease, now_ms)
  if not ok then
    failed[#failed + 1] = i
    failed[#failed + 1] = type(renewed) == 'table' and (renewed.err or 'ERR') or tostring(renewed)
  elseif not renewed then
    failed[#failed + 1] = i
    failed[#failed + 1] = 0
  end
end
return failed
