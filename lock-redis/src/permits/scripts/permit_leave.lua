-- KEYS[1] slots, KEYS[2] holders, KEYS[3] watchers.
-- ARGV[1] request nonce, ARGV[2] owner token of a permit acquire whose
-- outcome is unknown (its reply was lost, or its caller went away).
-- Frees the slot that attempt was granted, if any (its owner token is
-- unique, whatever the slot and fence), and tells the instances watching
-- the semaphore. Reads the holders of this semaphore only: one entry per
-- taken slot.
-- Returns {nonce, 1} when it freed a slot, {nonce, 0} otherwise.
local slots, holders = KEYS[1], KEYS[2]
local prefix = ARGV[2] .. ':'
local entries = redis.call('HGETALL', holders)
for i = 1, #entries, 2 do
  local slot, value = entries[i], entries[i + 1]
  if slot ~= 'permits' and string.sub(value, 1, #prefix) == prefix then
    redis.call('ZREM', slots, slot)
    redis.call('HDEL', holders, slot)
    if redis.call('EXISTS', KEYS[3]) == 1 then
      wake_watchers(slots, KEYS[3])
    end
    return {ARGV[1], 1}
  end
end
return {ARGV[1], 0}
