-- KEYS[1] slots, KEYS[2] holders. ARGV[1] request nonce.
-- Returns {nonce, slot1, ms left, value, slot2, ...} for every live permit
-- (or reader-writer share, its "<access>:<owner>" for a slot).
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {ARGV[1]}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = tonumber(live[i + 1]) - now
  out[#out + 1] = redis.call('HGET', KEYS[2], live[i])
end
return out
