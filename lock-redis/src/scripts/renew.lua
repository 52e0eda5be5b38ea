-- KEYS[1] lock key.
-- ARGV[1] request nonce, ARGV[2] "owner:fence" of the lease, ARGV[3] TTL in ms.
-- Extends the lock only if this lease still holds it; never re-creates it.
-- Returns {nonce, 1} when extended, {nonce, 0} when not held.
if redis.call('GET', KEYS[1]) == ARGV[2] then
  return {ARGV[1], redis.call('PEXPIRE', KEYS[1], ARGV[3])}
end
return {ARGV[1], 0}
