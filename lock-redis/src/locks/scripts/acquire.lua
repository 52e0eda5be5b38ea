-- KEYS[1] lock, KEYS[2] queue, KEYS[3] next, then the hand-off's keys:
-- KEYS[4] offers, KEYS[5] fence, KEYS[6] floor, KEYS[7] era.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] TTL in ms,
-- ARGV[4] the caller's wait member ('' when it will not wait),
-- ARGV[5] how long the line is kept without a refresh, in ms,
-- ARGV[6] the holder's label, ARGV[7] the lock delay after a failover in ms
-- (see era_check), ARGV[8] this attempt's number in its wait ('' outside
-- a wait), ARGV[9] the hand-off's lock delay ('' for none).
-- Grants the lock when the caller may take it (may_take: nobody barges
-- past a waiter). A caller that will wait joins the line, keeping its
-- place if it has one, and records its standing offer (handoff.lua). A
-- lock already held by a wait's owner (a hand-off whose message it has not
-- seen, or an earlier attempt whose reply was lost) is reported as its own.
-- Returns {nonce, replication id, 1, fence, -1} when granted,
--         {nonce, replication id, 2, fence, ms left} when handed over
--          already,
--         {nonce, replication id, 0, ms until the holder or reservation
--          expires (-1: never), or until a failover's lock delay ends, -1}.
local era, grants_wait = era_check(KEYS[7], ARGV[7])
if grants_wait > 0 then
  return {ARGV[1], era, 0, grants_wait, -1}
end
local lock, queue, me, owner = KEYS[1], KEYS[2], ARGV[4], ARGV[2]
local offers = KEYS[4]
if ARGV[8] ~= '' then
  local value = redis.call('GET', lock)
  if value and string.sub(value, 1, #owner + 1) == owner .. ':' then
    if me ~= '' then
      line_call('ZREM', queue, me)
      line_call('HDEL', offers, me)
    end
    local fence = tonumber(string.match(value, '^%S*:(%d+)'))
    return {ARGV[1], era, 2, fence, redis.call('PTTL', lock)}
  end
end
local wait_ms, quiet = may_take(lock, queue, KEYS[3], me, grant_from_tail())
if not wait_ms then
  if me ~= '' and not quiet then
    line_call('ZREM', queue, me)
    line_call('HDEL', offers, me)
  end
  local fence = grant_lock(lock, KEYS[5], KEYS[6], owner, ARGV[3], ARGV[6])
  return {ARGV[1], era, 1, fence, -1}
end
if me ~= '' then
  if not redis.call('ZSCORE', queue, me) then
    local tail = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2]
    line_call('ZADD', queue, (tonumber(tail) or 0) + 1, me)
  end
  if redis.call('PTTL', queue) < tonumber(ARGV[5]) then
    line_call('PEXPIRE', queue, ARGV[5])
  end
  if ARGV[8] ~= '' then
    record_offer(offers, me, ARGV[3], ARGV[8], owner, ARGV[6], ARGV[5])
  end
end
return {ARGV[1], era, 0, wait_ms, -1}
