-- Renews a batch of leases, locks, permits and reader-writer shares, each
-- owner- and fence-checked on its own (renew_one). KEYS, two per lease: a
-- lock's key twice, a semaphore's slots and holders, or a reader-writer
-- lock's shares and holders.
-- ARGV[1] request nonce, then three per lease: "owner:fence", TTL in ms,
-- slot ('' for a lock; a share's "<access>:<owner>").
-- Returns {nonce, r1, r2, ...}: 1 renewed, 0 not held, in lease order.
local out = {ARGV[1]}
local clock = {}
for i = 1, #KEYS / 2 do
  out[i + 1] = renew_one(KEYS[2 * i - 1], KEYS[2 * i],
    ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1], clock)
end
return out
