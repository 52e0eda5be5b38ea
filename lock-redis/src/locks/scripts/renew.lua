-- Renews a batch of leases, locks and permits, each owner- and
-- fence-checked on its own. KEYS, two per lease: a lock's key twice, or a
-- semaphore's slots and holders.
-- ARGV[1] request nonce, then three per lease: "owner:fence", TTL in ms,
-- slot ('' for a lock).
-- A lock is extended only if its key still holds this lease; a permit
-- only if its slot does and has not expired. Nothing is ever re-created.
-- Returns {nonce, r1, r2, ...}: 1 renewed, 0 not held, in lease order.
local out = {ARGV[1]}
local now
for i = 1, #KEYS / 2 do
  local key, holders = KEYS[2 * i - 1], KEYS[2 * i]
  local lease, ttl, slot = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local renewed = 0
  if slot == '' then
    if is_lease(redis.call('GET', key), lease) then
      renewed = redis.call('PEXPIRE', key, ttl)
    end
  else
    now = now or now_ms()
    local expiry = tonumber(redis.call('ZSCORE', key, slot))
    if expiry and expiry > now and is_lease(redis.call('HGET', holders, slot), lease) then
      local until_ms = now + tonumber(ttl)
      redis.call('ZADD', key, 'XX', until_ms, slot)
      permits_live_until(key, holders, until_ms, now)
      renewed = 1
    end
  end
  out[i + 1] = renewed
end
return out
