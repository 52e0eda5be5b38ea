-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] next, KEYS[5] watchers,
-- KEYS[6] floor, then the hand-off's keys (see grant_from_tail).
-- ARGV[1] request nonce, ARGV[2] the fence to evict ('' for any holder),
-- ARGV[3] the eviction channel, ARGV[4] the hand-off's lock delay ('' for
-- none).
-- Evicts whoever holds the lock (with ARGV[2], only the holder of that
-- fence; otherwise nothing changes) and advances the fence, so the next grant
-- and any resource that saw the bump refuse the evicted holder; tells the
-- holder by publishing "<lock key> <owner>:<fence>" on ARGV[3] (delivered
-- once the script is done); then hands the lock to (or wakes) the first
-- waiter in line, and wakes the watchers.
-- Returns {nonce, new fence, evicted's remaining ms, evicted value or nil}.
local value = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local lease = value and string.match(value, '^%S+')
if ARGV[2] ~= '' and (not lease or string.match(lease, ':(%d+)$') ~= ARGV[2]) then
  return {ARGV[1], 0, pttl, false}
end
if value then
  -- First, so that a channel the ACL denies fails the script before it
  -- changes anything.
  redis.call('PUBLISH', ARGV[3], KEYS[1] .. ' ' .. lease)
  redis.call('DEL', KEYS[1])
  wake_watchers(KEYS[1], KEYS[5])
end
local fence = next_fence(KEYS[2], KEYS[6])
if redis.call('EXISTS', KEYS[4]) == 0 then
  wake_next(KEYS[1], KEYS[3], KEYS[4], '', grant_from_tail())
end
return {ARGV[1], fence, pttl, value}
