-- Shared by every script that grants (prepended to them).
-- Advances the fence counter `fence_key` and returns the new token, as a
-- number and as decimal text: one more than the last token, never below the
-- server clock in microseconds (Redis TIME), and above the fence floor of
-- the name's Cluster slot (`floor_key`, raised after a restore). A counter
-- wiped by a restart without persistence, or rolled back by a lost AOF tail,
-- restarts above every token issued before, as long as the server clock did
-- not step back; a floor raised after restoring a backup covers the rest.
-- Tokens stay below 2^53, so Lua's doubles hold them exactly.
local function next_fence(fence_key, floor_key)
  local now = redis.call('TIME')
  local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local stored = redis.call('MGET', fence_key, floor_key)
  local last = tonumber(stored[1] or '0') or 0
  local floor = tonumber(stored[2] or '0') or 0
  if last >= 9007199254740991 or floor >= 9007199254740991 then
    error(redis.error_reply('fence counter ' .. fence_key .. ' is beyond 2^53: tokens could repeat'))
  end
  if last >= fence then
    fence = last + 1
  end
  if floor >= fence then
    fence = floor + 1
  end
  local decimal = string.format('%d', fence)
  redis.call('SET', fence_key, decimal)
  return fence, decimal
end
