-- The hand-off grant, shared by the scripts that free or claim a lock
-- (prepended after next_fence, era_check and the line).
--
-- A waiter's place in line is a standing offer: each of its attempts
-- records, in the name's offers hash (a line key, not propagated),
--   offers[member] = "<expires_at ms> <ttl ms> <seq> <owner> <label>"
-- where expires_at is the attempt's server time plus its TTL: had the
-- attempt found the lock free, its grant would have run out then. A
-- release may grant the lock on that offer itself, so the waiter starts
-- work without another request; its lease is counted from its own send of
-- attempt `seq`, never from the message's arrival.

-- Grants the lock `lock` to `owner` for `ttl` ms under `label`, with a
-- fence from the name's counter (above the slot's floor). Returns the fence
-- and its decimal text.
local function grant_lock(lock, fence_key, floor_key, owner, ttl, label)
  local fence, decimal = next_fence(fence_key, floor_key)
  redis.call('SET', lock, owner .. ':' .. decimal .. ' ' .. label, 'PX', ttl)
  return fence, decimal
end


-- The server clock in ms.
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Records the standing offer of the waiter `member` (attempt `seq` of a
-- wait by `owner`, TTL `ttl` ms), kept as long as the line.
local function record_offer(offers_key, member, ttl, seq, owner, label, linger)
  ttl = tonumber(ttl)
  local offer = string.format('%d %d %s %s %s', server_ms() + ttl, ttl, seq, owner, label)
  line_call('HSET', offers_key, member, offer)
  if redis.call('PTTL', offers_key) < tonumber(linger) then
    line_call('PEXPIRE', offers_key, linger)
  end
end

-- The grant on offer for wake_next, or nil where the store cannot promise
-- it (the lossless mode: a grant must reach the replicas before it is
-- used). `h` names the keys: offers, fence, floor, era, and the lock delay
-- `delay` (see era_check).
-- The returned function hands the free lock `lock_key` to `member`, woken
-- on `channel`, if its offer has at least half its TTL left (its waiter
-- re-attempts every third of it, so a live waiter's offer is fresh) and no
-- failover's lock delay holds grants back: it grants, then publishes
-- "<member> <lock key> granted <fence> <seq>". Returns 'granted', 'gone'
-- (nobody heard: the grant is taken back in the same script, its fence
-- stays unused) or nil (no fresh offer: reserve instead).
local function offer_grant(h)
  if not h then
    return nil
  end
  return function(lock_key, member, channel)
    local offer = redis.call('HGET', h.offers, member)
    if not offer then
      return nil
    end
    line_call('HDEL', h.offers, member)
    local expires_at, ttl, seq, owner, label =
      string.match(offer, '^(%d+) (%d+) (%d+) (%S+) (.*)$')
    if not label then
      return nil
    end
    local left = tonumber(expires_at) - server_ms()
    if left * 2 < tonumber(ttl) then
      return nil
    end
    local _, grants_wait = era_check(h.era, h.delay)
    if grants_wait > 0 then
      return nil
    end
    -- Granted first (the message leaves once the script is done), taken
    -- back at once if nobody hears it.
    local _, decimal = grant_lock(lock_key, h.fence, h.floor, owner, left, label)
    local message = member .. ' ' .. lock_key .. ' granted ' .. decimal .. ' ' .. seq
    if redis.call('PUBLISH', channel, message) == 0 then
      redis.call('DEL', lock_key)
      return 'gone'
    end
    return 'granted'
  end
end

-- offer_grant for a script whose last four keys are the name's offers,
-- fence, floor and era, and whose last argument is the lock delay in ms
-- (see era_check), or '' where grants are not handed off.
local function grant_from_tail()
  local delay = ARGV[#ARGV]
  if delay == '' then
    return nil
  end
  local k = #KEYS
  return offer_grant({offers = KEYS[k - 3], fence = KEYS[k - 2], floor = KEYS[k - 1],
                      era = KEYS[k], delay = delay})
end
