-- Renew many Locks' leases at once (the watchdog's batch), each to ARGV[1] ms from now.
-- KEYS[1] lock      the first Lock's STRING (_lock_value.lua); KEYS[i] the i-th
-- ARGV[1] lease_ms  the new lease of every one
-- ARGV[2] token     KEYS[1]'s holder's token; ARGV[1 + i] KEYS[i]'s
-- On Redis Cluster every key of one call is in one hash slot.
-- Returns the renewals that did not happen, as pairs {i, 0} when KEYS[i] is
-- not (or no longer) its holder's, {i, text} when its command failed (a key of
-- another type): an empty array when every lease was renewed, so the reply
-- costs nothing to read in the common case. One key's error never stops the
-- others' renewals.
local failed = {}
local lease = ARGV[1]
for i, key in ipairs(KEYS) do
  local ok, renewed = pcall(extend_lock, key, ARGV[i + 1], lease)
  if not ok then
    failed[#failed + 1] = i
    failed[#failed + 1] = type(renewed) == 'table' and (renewed.err or 'ERR') or tostring(renewed)
  elseif renewed == 0 then
    failed[#failed + 1] = i
    failed[#failed + 1] = 0
  end
end
return failed
