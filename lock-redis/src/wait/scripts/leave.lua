-- KEYS[1] lock, KEYS[2] queue, KEYS[3] next, KEYS[4] watchers, then the
-- hand-off's keys (see grant_from_tail).
-- ARGV[1] request nonce, ARGV[2] wait member ('' for none),
-- ARGV[3] owner token of an attempt whose outcome is unknown, or of a wait
-- that may have been handed the lock ('' for none), ARGV[4] the fence of a
-- hand-off grant announced to a wait that had ended ('' for none),
-- ARGV[5] the hand-off's lock delay ('' for none).
-- A wait that ends without the lock (timeout, cancellation, error), or a
-- wake-up for a wait that already ended: leaves the line (and its standing
-- offer), passes a reservation made for it on to the next waiter, and frees
-- the lock if the unknown attempt or a hand-off got it (the owner token is
-- unique, whatever the fence; a fence is unique per name).
-- Returns {nonce, 1} when it freed the lock, {nonce, 0} otherwise.
local freed_lock = 0
if ARGV[2] ~= '' then
  line_call('ZREM', KEYS[2], ARGV[2])
  line_call('HDEL', KEYS[5], ARGV[2])
  if redis.call('GET', KEYS[3]) == ARGV[2] then
    line_call('DEL', KEYS[3])
  end
end
if ARGV[3] ~= '' or ARGV[4] ~= '' then
  local value = redis.call('GET', KEYS[1])
  if value and ((ARGV[3] ~= '' and string.sub(value, 1, #ARGV[3] + 1) == ARGV[3] .. ':')
                or (ARGV[4] ~= '' and string.match(value, '^%S*:(%d+)') == ARGV[4])) then
    redis.call('DEL', KEYS[1])
    freed_lock = 1
    wake_watchers(KEYS[1], KEYS[4])
  end
end
if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  wake_next(KEYS[1], KEYS[2], KEYS[3], '', grant_from_tail())
end
return {ARGV[1], freed_lock}
