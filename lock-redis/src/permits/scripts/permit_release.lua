-- KEYS[1] slots, KEYS[2] holders, KEYS[3] watchers.
-- ARGV[1] request nonce, ARGV[2] "owner:fence" of the permit, ARGV[3] its slot.
-- Frees the slot only if this permit still holds it and it has not
-- expired, and tells the instances watching the semaphore. Also releases
-- a reader-writer share (its shares, holders and watchers; its
-- "<access>:<owner>" for a slot).
-- Returns {nonce, 1} when released, {nonce, 0} when not held.
local slots, holders, slot = KEYS[1], KEYS[2], ARGV[3]
local expiry = tonumber(redis.call('ZSCORE', slots, slot))
if not expiry or expiry <= now_ms() or not is_lease(redis.call('HGET', holders, slot), ARGV[2]) then
  return {ARGV[1], 0}
end
redis.call('ZREM', slots, slot)
redis.call('HDEL', holders, slot)
if redis.call('EXISTS', KEYS[3]) == 1 then
  wake_watchers(slots, KEYS[3])
end
return {ARGV[1], 1}
