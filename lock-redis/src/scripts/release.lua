-- KEYS[1] lock key.
-- ARGV[1] request nonce, ARGV[2] "owner:fence" of the lease, ARGV[3] wake-up channel.
-- Deletes the lock only if this lease still holds it, and wakes waiters.
-- Returns {nonce, 1} when released, {nonce, 0} when not held.
if redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], 'released')
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
