-- KEYS[1] lock, KEYS[2] queue, KEYS[3] next, KEYS[4] watchers, then the
-- hand-off's keys (see grant_from_tail).
-- ARGV[1] request nonce, ARGV[2] "owner:fence" of the lease, ARGV[3] the
-- hand-off's lock delay ('' for none).
-- Deletes the lock only if this lease still holds it, hands it to (or
-- wakes) the first waiter in line (only that one) and wakes the instances
-- watching it.
-- Returns {nonce, 1} when released, {nonce, 0} when not held.
if is_lease(redis.call('GET', KEYS[1]), ARGV[2]) then
  redis.call('DEL', KEYS[1])
  freed(KEYS[1], KEYS[2], KEYS[3], KEYS[4], grant_from_tail())
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
