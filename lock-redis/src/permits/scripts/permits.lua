-- Semaphore helpers (prepended to the permit scripts). A semaphore's keys
-- share its name's hash tag:
--   slots    zset: taken slot -> expiry, server time in ms
--   holders  hash: slot -> "<owner>:<fence> <label>", 'permits' -> N
-- A slot whose expiry has passed is free; the keys themselves expire with
-- the last permit, so an idle semaphore leaves nothing (its fence stays).
-- A reader-writer lock keeps its shares the same way (a share's
-- "<access>:<owner>" for a slot, no 'permits'), so these helpers, the
-- permit release and inspect serve it too.

-- The server clock in ms.
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Forgets slots that expired by `now`.
local function purge_expired(slots, holders, now)
  local expired = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  if #expired > 0 then
    redis.call('HDEL', holders, unpack(expired))
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  end
end

-- Keeps both keys at least until `until_ms` (the latest expiry of a slot).
local function permits_live_until(slots, holders, until_ms, now)
  if redis.call('PTTL', slots) < until_ms - now then
    redis.call('PEXPIREAT', slots, until_ms)
    redis.call('PEXPIREAT', holders, until_ms)
  end
end
