-- KEYS[1] shares, KEYS[2] holders, KEYS[3] intents, KEYS[4] watchers.
-- ARGV[1] request nonce, ARGV[2] the intent id of a writer that stopped
-- waiting ('' for none), ARGV[3] the holder "<access>:<owner>" of an
-- acquire whose outcome is unknown ('' for none: its owner token is unique,
-- whatever the fence).
-- Removes the intent and frees the share that acquire may have been
-- granted; when either was there, tells the instances watching the
-- reader-writer lock (readers a writer kept out may be admitted now).
-- Returns {nonce, 1} when it freed a share, {nonce, 0} otherwise.
local changed, freed = 0, 0
if ARGV[2] ~= '' then
  changed = redis.call('ZREM', KEYS[3], ARGV[2])
end
if ARGV[3] ~= '' then
  freed = redis.call('ZREM', KEYS[1], ARGV[3])
  redis.call('HDEL', KEYS[2], ARGV[3])
end
if changed + freed > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  wake_watchers(KEYS[1], KEYS[4])
end
return {ARGV[1], freed}
