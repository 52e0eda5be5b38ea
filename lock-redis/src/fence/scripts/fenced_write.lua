-- Resource-side fencing for data kept in Redis.
-- KEYS[1] the resource's fence key.
-- ARGV[1] request nonce, ARGV[2] the writer's fencing token (decimal),
-- ARGV[3..] one Redis command.
-- Runs the command only if the token is not older than the last token
-- applied through KEYS[1], then records the token. Tokens are compared as
-- decimal strings, so every u64 compares exactly. A command that fails
-- changes nothing (it runs before the fence is recorded).
-- Returns {nonce, 1, command reply} when applied, {nonce, 0, last token} when refused.
local token = ARGV[2]
if not string.match(token, '^[1-9]%d*$') then
  return redis.error_reply('fenced write: the token must be a positive decimal integer')
end
local last = redis.call('GET', KEYS[1])
if last then
  if not string.match(last, '^[1-9]%d*$') then
    return redis.error_reply('fenced write: the fence key does not hold a token')
  end
  if #last > #token or (#last == #token and last > token) then
    return {ARGV[1], 0, last}
  end
end
local reply = redis.call(unpack(ARGV, 3))
redis.call('SET', KEYS[1], token)
return {ARGV[1], 1, reply}
