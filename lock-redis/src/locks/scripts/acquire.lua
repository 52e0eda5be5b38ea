-- KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] next, KEYS[5] floor,
-- KEYS[6] era.
-- ARGV[1] request nonce, ARGV[2] owner token, ARGV[3] TTL in ms,
-- ARGV[4] the caller's wait member ('' when it will not wait),
-- ARGV[5] how long the line is kept without a refresh, in ms,
-- ARGV[6] the holder's label, ARGV[7] the lock delay after a failover in ms
-- (see era_check).
-- Grants a free lock to the waiter it is reserved for, else to the head of
-- the line, else (empty line) to the caller: nobody barges past a waiter.
-- When the lock is free, unreserved and someone else heads the line, that
-- waiter is woken (expiry sends no message). A caller that will wait joins
-- the line, keeping its place if it has one.
-- Returns {nonce, replication id, 1, fence} when granted,
--         {nonce, replication id, 0, ms until the holder or reservation
--          expires (-1: never), or until a failover's lock delay ends}.
local era, grants_wait = era_check(KEYS[6], ARGV[7])
if grants_wait > 0 then
  return {ARGV[1], era, 0, grants_wait}
end
local lock, queue, next_key, me = KEYS[1], KEYS[3], KEYS[4], ARGV[4]
local wait_ms
-- quiet: nothing is held, reserved or queued under this name.
local quiet = redis.call('EXISTS', lock, next_key, queue) == 0
if not quiet then
  wait_ms = redis.call('PTTL', lock)
end
-- Free, nobody waits and nothing is reserved (the common case): wait_ms is nil.
if wait_ms == -2 then
  local reserved = redis.call('GET', next_key)
  if reserved == me then
    line_call('DEL', next_key)
    wait_ms = nil
  elseif not reserved and wake_next(lock, queue, next_key, me) ~= 'reserved' then
    wait_ms = nil
  else
    wait_ms = redis.call('PTTL', next_key)
  end
end
if not wait_ms then
  if me ~= '' and not quiet then
    line_call('ZREM', queue, me)
  end
  local fence, decimal = next_fence(KEYS[2], KEYS[5])
  redis.call('SET', lock, ARGV[2] .. ':' .. decimal .. ' ' .. ARGV[6], 'PX', ARGV[3])
  return {ARGV[1], era, 1, fence}
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
