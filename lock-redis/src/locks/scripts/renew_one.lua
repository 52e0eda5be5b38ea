-- Shared by the renewal scripts (prepended to them).
-- Renews one lease: a lock (`key` its lock key, `slot` '') or a permit
-- (`key` the semaphore's slots, `holders` its holders, `slot` the permit's
-- slot) or a reader-writer share (`key` the shares, `holders` their
-- holders, `slot` the share's "<access>:<owner>"), owner- and fence-checked. A lock is extended only if its key still
-- holds this lease; a permit only if its slot does and has not expired.
-- Nothing is ever re-created. `clock` keeps the server time read once per
-- script. Returns 1 renewed, 0 not held.
local function renew_one(key, holders, lease, ttl, slot, clock)
  if slot == '' then
    if is_lease(redis.call('GET', key), lease) then
      return redis.call('PEXPIRE', key, ttl)
    end
    return 0
  end
  clock.now = clock.now or now_ms()
  local now = clock.now
  local expiry = tonumber(redis.call('ZSCORE', key, slot))
  if expiry and expiry > now and is_lease(redis.call('HGET', holders, slot), lease) then
    local until_ms = now + tonumber(ttl)
    redis.call('ZADD', key, 'XX', until_ms, slot)
    permits_live_until(key, holders, until_ms, now)
    return 1
  end
  return 0
end
