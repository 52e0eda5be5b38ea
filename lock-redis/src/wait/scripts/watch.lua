-- KEYS[1] the watched lock key or permit slots, KEYS[2] its watchers.
-- ARGV[1] request nonce, ARGV[2] this instance's channel,
-- ARGV[3] how long the registration is kept, in ms,
-- ARGV[4] 'permits' for a semaphore.
-- Registers the instance for one "changed <key>" message at the next
-- release or forced release (see wake_watchers). Expiry sends no message:
-- returns when the holder (for a semaphore: the first permit) expires, in
-- ms, or -1 when nothing is held that will expire.
line_call('SADD', KEYS[2], ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  line_call('PEXPIRE', KEYS[2], ARGV[3])
end
if ARGV[4] ~= 'permits' then
  return {ARGV[1], redis.call('PTTL', KEYS[1])}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if not first then
  return {ARGV[1], -1}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return {ARGV[1], math.max(tonumber(first) - now_ms, 0)}
