-- Renews the leases of many slots served by one Redis Cluster primary in
-- one script (flag allow-cross-slot-keys, prepended): their keys are
-- arguments, not declared keys, which must share one slot.
-- KEYS[1]: one of the leases' keys, which routes the script to its primary.
-- ARGV[1] request nonce, then five per lease: its key, the holders key (a
-- lock's key again for a lock), "owner:fence", TTL in ms, slot ('' for a
-- lock, a share's "<access>:<owner>" for a reader-writer lock).
-- Returns {nonce, r1, r2, ...} in lease order: 1 renewed, 0 not held, -1
-- not served here (its slot moved, or is moving): the caller renews that
-- one with a script of its slot, which follows MOVED and ASK.
local out = {ARGV[1]}
local clock = {}
for i = 1, (#ARGV - 1) / 5 do
  local at = 5 * i - 3
  local key, holders = ARGV[at], ARGV[at + 1]
  if type(redis.pcall('EXISTS', key, holders)) == 'table' then
    out[i + 1] = -1
  else
    out[i + 1] = renew_one(key, holders, ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], clock)
  end
end
return out
