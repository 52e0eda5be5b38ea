-- KEYS: fence floor keys (one per Cluster slot).
-- ARGV[1] request nonce, ARGV[2] the floor (decimal, below 2^53).
-- Raises each floor to ARGV[2]; never lowers one. Every grant reads its
-- slot's floor in the same script (see next_fence).
local floor = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  if (tonumber(redis.call('GET', key) or '0') or 0) < floor then
    redis.call('SET', key, ARGV[2])
  end
end
return {ARGV[1]}
