-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] next, KEYS[5] floor,
-- KEYS[6] era.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] TTL in ms,
-- ARGV[4] the caller's wait member ('' when it will not wait),
-- ARGV[5] how long the line is kept without a refresh, in ms,
-- ARGV[6] the holder's label, ARGV[7] the lock delay after a failover in ms
-- (see era_check).
-- Grants the lock when the caller may take it (may_take: nobody barges
-- past a waiter). A caller that will wait joins the line, keeping its
-- place if it has one.
-- Returns {nonce, replication id, 1, fence} when granted,
--         {nonce, replication id, 0, ms until the holder or reservation
--          expires (-1: never), or until a failover's lock delay ends}.
local era, grants_wait = era_check(KEYS[6], ARGV[7])
if grants_wait > 0 then
  return {ARGV[1], era, 0, grants_wait}
end
local lock, queue, me = KEYS[1], KEYS[3], ARGV[4]
local wait_ms, quiet = may_take(lock, queue, KEYS[4], me)
if not wait_ms then
  if me ~= '' and not quiet then
    line_call('ZREM', queue, me)
  end
  return {ARGV[1], era, 1, grant_lock(lock, KEYS[2], KEYS[5], ARGV[2], ARGV[3], ARGV[6])}
end
if me ~= '' then
  if not redis.call('ZSCORE', queue, me) then
    local tail = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2]
    line_call('ZADD', queue, (tonumber(tail) or 0) + 1, me)
  end
  if redis.call('PTTL', queue) < tonumber(ARGV[5]) then
    line_call('PEXPIRE', queue, ARGV[5])
  end
end
return {ARGV[1], era, 0, wait_ms}
