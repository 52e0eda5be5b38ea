-- KEYS[1] shares, KEYS[2] holders, KEYS[3] intents, KEYS[4] fence,
-- KEYS[5] floor, KEYS[6] era.
-- ARGV[1] request nonce, ARGV[2] 'read' or 'write', ARGV[3] owner token,
-- ARGV[4] TTL in ms, ARGV[5] the holder's label, ARGV[6] the lock delay
-- after a failover in ms (see era_check), ARGV[7] the intent id of a
-- waiting writer ('' when the caller will not wait, and for a read).
-- A read is granted while no writer holds the name and no writer waits (no
-- live intent); a write while nobody holds it. Each grant takes a fence
-- from the reader-writer lock's one counter and adds its holder
-- "<access>:<owner>" to the shares with its expiry. A waiting writer's
-- intent is refreshed (expiry: now + TTL) when it is refused, and removed
-- with its grant.
-- Returns {nonce, replication id, {1, fence}} when granted,
--         {nonce, replication id, {0, ms until the first expiry that may
--          admit it (a holder's, or for a read an intent's; -1: none), or
--          until a failover's lock delay ends}}.
local era, grants_wait = era_check(KEYS[6], ARGV[6])
if grants_wait > 0 then
  return {ARGV[1], era, {0, grants_wait}}
end
local shares, holders, intents = KEYS[1], KEYS[2], KEYS[3]
local access, ttl, intent = ARGV[2], tonumber(ARGV[4]), ARGV[7]
local now = now_ms()
purge_expired(shares, holders, now)
redis.call('ZREMRANGEBYSCORE', intents, '-inf', now)

-- The earliest score in zset `key`, or nil.
local function first_expiry(key)
  return tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
end

local wait_until
if access == 'read' then
  -- A writer holds alone: it is the one holder when there is one.
  local held = redis.call('ZRANGE', shares, 0, 1)
  if #held == 1 and string.sub(held[1], 1, 6) == 'write:' then
    wait_until = first_expiry(shares)
  end
  local waiting = first_expiry(intents)
  if waiting and (not wait_until or waiting < wait_until) then
    wait_until = waiting
  end
elseif access == 'write' then
  wait_until = first_expiry(shares)
  if wait_until and intent ~= '' then
    redis.call('ZADD', intents, now + ttl, intent)
    if redis.call('PTTL', intents) < ttl then
      redis.call('PEXPIREAT', intents, now + ttl)
    end
  end
else
  return redis.error_reply('rw_acquire: access must be read or write')
end
if wait_until then
  return {ARGV[1], era, {0, math.max(wait_until - now, 0)}}
end

local fence, decimal = next_fence(KEYS[4], KEYS[5])
local member = access .. ':' .. ARGV[3]
local until_ms = now + ttl
redis.call('ZADD', shares, until_ms, member)
redis.call('HSET', holders, member, ARGV[3] .. ':' .. decimal .. ' ' .. ARGV[5])
permits_live_until(shares, holders, until_ms, now)
if intent ~= '' then
  redis.call('ZREM', intents, intent)
end
return {ARGV[1], era, {1, fence}}
