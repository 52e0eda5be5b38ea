-- KEYS[1] lock key, KEYS[2] fence key.
-- ARGV[1] request nonce, ARGV[2] wake-up channel.
-- Evicts whoever holds the lock and advances the fence, so the next grant
-- and any resource that saw the bump refuse the evicted holder.
-- Returns {nonce, new fence, evicted's remaining ms, evicted value or nil}.
local value = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
if value then
  redis.call('DEL', KEYS[1])
end
local fence = next_fence(KEYS[2])
if value then
  redis.call('PUBLISH', ARGV[2], 'forced')
end
return {ARGV[1], fence, pttl, value}
