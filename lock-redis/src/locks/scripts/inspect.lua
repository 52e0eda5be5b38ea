-- KEYS[1] lock key; ARGV[1] request nonce.
-- Returns {nonce, remaining ms, value} read atomically (value nil when free).
return {ARGV[1], redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
