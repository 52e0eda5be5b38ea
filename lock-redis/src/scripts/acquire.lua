-- KEYS[1] lock key, KEYS[2] fence key.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] TTL in ms.
-- Returns {nonce, 1, fence} when granted,
--         {nonce, 0, remaining ms (-1: no expiry)} when held.
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  return {ARGV[1], 0, pttl}
end
local fence, decimal = next_fence(KEYS[2])
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. decimal, 'PX', ARGV[3])
return {ARGV[1], 1, fence}
