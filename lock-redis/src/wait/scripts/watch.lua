-- KEYS[1] the watched key (a lock key, a semaphore's slots, a reader-writer
-- lock's shares), KEYS[2] its watchers, KEYS[3..] the sorted sets of
-- expiries (server ms) that bound the wake-up: none for a lock (its key's
-- own TTL), the slots for a semaphore, the shares and the writers' intents
-- for a reader-writer lock.
-- ARGV[1] request nonce, ARGV[2] this instance's channel,
-- ARGV[3] how long the registration is kept, in ms.
-- Registers the instance for one "changed <key>" message at the next
-- release or forced release (see wake_watchers). Expiry sends no message:
-- returns when the first of those expires, in ms, or -1 when nothing will.
line_call('SADD', KEYS[2], ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  line_call('PEXPIRE', KEYS[2], ARGV[3])
end
if #KEYS == 2 then
  return {ARGV[1], redis.call('PTTL', KEYS[1])}
end
local first
for i = 3, #KEYS do
  local expiry = tonumber(redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')[2])
  if expiry and (not first or expiry < first) then
    first = expiry
  end
end
if not first then
  return {ARGV[1], -1}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return {ARGV[1], math.max(first - now_ms, 0)}
