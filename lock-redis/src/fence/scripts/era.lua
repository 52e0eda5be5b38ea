-- Shared by every script that grants (prepended to them).
-- Which incarnation of the server grants: its replication id (INFO
-- replication's master_replid), which a promoted replica changes. `era_key`
-- (one per Cluster slot) records the id the slot's grants came from and,
-- after a failover seen with a lock delay, the server time (ms) before which
-- nothing is granted: the old primary's leases may be missing here while
-- their holders still work. `delay_ms` is the caller's lock delay (0: none);
-- below 0 the id cannot be read (INFO denied) and nothing is checked.
-- Returns the id ('' when unchecked) and the ms grants still wait (0: none).
local function era_check(era_key, delay_ms)
  delay_ms = tonumber(delay_ms)
  if delay_ms < 0 then
    return '', 0
  end
  local id = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local stored = redis.call('HMGET', era_key, 'id', 'from')
  local from = tonumber(stored[2] or '0') or 0
  if stored[1] ~= id then
    if stored[1] and now + delay_ms > from then
      from = now + delay_ms
    end
    redis.call('HSET', era_key, 'id', id, 'from', string.format('%d', from))
  end
  if from > now then
    return id, from - now
  end
  return id, 0
end
