-- Shared by the scripts that grant locks (prepended to them, after the
-- line, next_fence and the hand-off): the rule for taking a name now.

-- Whether the caller whose wait member is `me` ('' when it will not wait)
-- may take the lock `lock` now. A free lock goes to the waiter it is
-- reserved for, else to the head of the line, else (empty line) to the
-- caller: nobody barges past a waiter. When the lock is free, unreserved
-- and someone else heads the line, that waiter is woken (wake_next, which
-- grants the lock to it on its offer with `grant`, or reserves it; expiry
-- sends no message). A reservation for `me` is taken (deleted).
-- Returns nil when the caller may take it, else the ms until the holder or
-- the reservation expires (-1: never); and whether the name was quiet
-- (nothing held, reserved or queued).
local function may_take(lock, queue, next_key, me, grant)
  if redis.call('EXISTS', lock, next_key, queue) == 0 then
    return nil, true
  end
  local wait_ms = redis.call('PTTL', lock)
  if wait_ms ~= -2 then
    return wait_ms, false
  end
  local reserved = redis.call('GET', next_key)
  if reserved == me then
    line_call('DEL', next_key)
    return nil, false
  end
  if reserved then
    return redis.call('PTTL', next_key), false
  end
  local woke = wake_next(lock, queue, next_key, me, grant)
  if woke == 'granted' then
    return redis.call('PTTL', lock), false
  end
  if woke ~= 'reserved' then
    return nil, false
  end
  return redis.call('PTTL', next_key), false
end
