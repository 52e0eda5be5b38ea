-- Shared by acquire and force_release (prepended to both scripts).
-- Advances the fence counter `fence_key` and returns the new token, as a
-- number and as decimal text: one more than the last token, and never below
-- the server clock in microseconds (Redis TIME). A counter wiped by a restart
-- without persistence, or rolled back by a lost AOF tail, restarts above every
-- token issued before, as long as the server clock did not step back. Tokens
-- stay below 2^53, so Lua's doubles hold them exactly (until the year 2255).
local function next_fence(fence_key)
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('GET', fence_key) or '0') or 0
  if last >= 9007199254740991 then
    error(redis.error_reply('fence counter ' .. fence_key .. ' is beyond 2^53: tokens could repeat'))
  end
  local fence = last + 1
  if fence < floor then
    fence = floor
  end
  local decimal = string.format('%d', fence)
  redis.call('SET', fence_key, decimal)
  return fence, decimal
end
