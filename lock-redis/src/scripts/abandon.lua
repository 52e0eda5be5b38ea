-- KEYS[1] lock key.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] wake-up channel.
-- Cleans up after an acquire whose reply was lost: deletes the lock if this
-- owner token (unique per attempt) holds it, whatever its fence.
-- Returns {nonce, 1} when it deleted the lock, {nonce, 0} otherwise.
local value = redis.call('GET', KEYS[1])
if value and string.sub(value, 1, #ARGV[2] + 1) == ARGV[2] .. ':' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], 'released')
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
