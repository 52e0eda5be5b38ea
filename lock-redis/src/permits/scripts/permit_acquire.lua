-- KEYS[1] slots, KEYS[2] holders, KEYS[3] fence, KEYS[4] floor, KEYS[5] era.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] TTL in ms,
-- ARGV[4] permits (N), ARGV[5] the holder's label, ARGV[6] the lock delay
-- after a failover in ms (see era_check).
-- Takes the lowest free slot below N, if fewer than N are taken, with a
-- fence from the semaphore's counter (strictly increasing for every slot).
-- While any permit is held the semaphore keeps its N: another N is refused.
-- Returns {nonce, replication id, {1, fence, slot}} when granted,
--         {nonce, replication id, {0, ms until the first permit expires, or
--          until a failover's lock delay ends}} when none can be granted,
--         {nonce, replication id, {-1, the N in force}} on a different N.
local era, grants_wait = era_check(KEYS[5], ARGV[6])
if grants_wait > 0 then
  return {ARGV[1], era, {0, grants_wait}}
end
local slots, holders = KEYS[1], KEYS[2]
local permits = tonumber(ARGV[4])
local now = now_ms()
purge_expired(slots, holders, now)
local taken = redis.call('ZCARD', slots)
if taken > 0 then
  local existing = tonumber(redis.call('HGET', holders, 'permits'))
  if existing and existing ~= permits then
    return {ARGV[1], era, {-1, existing}}
  end
end
if taken >= permits then
  local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')[2]
  return {ARGV[1], era, {0, math.max(tonumber(first) - now, 0)}}
end
-- Among slots 0..taken at least one is free: at most taken + 1 lookups.
local slot = 0
while redis.call('ZSCORE', slots, slot) do
  slot = slot + 1
end
local fence, decimal = next_fence(KEYS[3], KEYS[4])
local until_ms = now + tonumber(ARGV[3])
redis.call('ZADD', slots, until_ms, slot)
redis.call('HSET', holders, slot, ARGV[2] .. ':' .. decimal .. ' ' .. ARGV[5], 'permits', permits)
permits_live_until(slots, holders, until_ms, now)
return {ARGV[1], era, {1, fence, slot}}
