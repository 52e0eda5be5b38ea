-- Several locks at once: every one of them, or none.
-- KEYS, six per name (as acquire.lua's): lock, fence, queue, next, floor,
-- era.
-- ARGV[1] request nonce, ARGV[2] the lock delay after a failover in ms
-- (see era_check), then three per name: owner token, TTL in ms, label.
-- Each name is judged as acquire.lua judges a caller that will not wait
-- (may_take: a name reserved for or queued by a waiter counts as held, and
-- wakes that waiter as acquire.lua would). Only when every name may be
-- taken is any granted, each as acquire.lua grants it (its own fence from
-- its own counter, above its slot's floor, its TTL and label); otherwise
-- no lock or fence is written.
-- Returns {nonce, replication id, {1, fence, fence, ...}} (in KEYS order)
--         when granted,
--         {nonce, replication id, {0, i, ms until the i-th name's holder or
--          reservation expires (-1: never), or until a failover's lock
--          delay ends}} when the i-th name (from 1) may not be taken.
local names = #KEYS / 6
local era, checked = '', {}
for i = 1, names do
  local era_key = KEYS[6 * i]
  if not checked[era_key] then
    checked[era_key] = true
    local grants_wait
    era, grants_wait = era_check(era_key, ARGV[2])
    if grants_wait > 0 then
      return {ARGV[1], era, {0, i, grants_wait}}
    end
  end
end
for i = 1, names do
  local at = 6 * (i - 1)
  local wait_ms = may_take(KEYS[at + 1], KEYS[at + 3], KEYS[at + 4], '')
  if wait_ms then
    return {ARGV[1], era, {0, i, wait_ms}}
  end
end
local fences = {1}
for i = 1, names do
  local at, arg = 6 * (i - 1), 3 * i
  fences[i + 1] = grant_lock(KEYS[at + 1], KEYS[at + 2], KEYS[at + 5],
    ARGV[arg], ARGV[arg + 1], ARGV[arg + 2])
end
return {ARGV[1], era, fences}
