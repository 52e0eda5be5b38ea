-- Raises the fence floors of many slots served by one Redis Cluster
-- primary in one script (flag allow-cross-slot-keys, prepended): the floor
-- keys are arguments, not declared keys, which must share one slot.
-- KEYS[1]: one of the floor keys, which routes the script to its primary.
-- ARGV[1] request nonce, ARGV[2] the floor (decimal, below 2^53), then the
-- floor keys. Raises each to the floor; never lowers one.
-- Returns {nonce, {i, ...}}: the positions (1-based) of the keys this
-- primary does not serve (their slot moved, or is moving), left untouched
-- for the caller to raise by their slot.
local floor = tonumber(ARGV[2])
local missed = {}
for i = 3, #ARGV do
  local current = redis.pcall('GET', ARGV[i])
  if type(current) == 'table' then
    missed[#missed + 1] = i - 2
  elseif (tonumber(current or '0') or 0) < floor then
    redis.call('SET', ARGV[i], ARGV[2])
  end
end
return {ARGV[1], missed}
