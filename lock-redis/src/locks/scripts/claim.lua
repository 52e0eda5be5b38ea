-- Shared by the scripts that grant locks (prepended to them, after the
-- line and next_fence): the rule for taking a name now, and the grant.

-- Whether the caller whose wait member is `me` ('' when it will not wait)
-- may take the lock `lock` now. A free lock goes to the waiter it is
-- reserved for, else to the head of the line, else (empty line) to the
-- caller: nobody barges past a waiter. When the lock is free, unreserved
-- and someone else heads the line, that waiter is woken (wake_next, which
-- reserves the lock for it; expiry sends no message). A reservation for
-- `me` is taken (deleted).
-- Returns nil when the caller may take it, else the ms until the holder or
-- the reservation expires (-1: never); and whether the name was quiet
-- (nothing held, reserved or queued).
local function may_take(lock, queue, next_key, me)
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
  if not reserved and wake_next(lock, queue, next_key, me) ~= 'reserved' then
    return nil, false
  end
  return redis.call('PTTL', next_key), false
end

-- Grants the lock `lock` to `owner` for `ttl` ms under `label`, with a
-- fence from the name's counter (above the slot's floor). Returns the fence.
local function grant_lock(lock, fence_key, floor_key, owner, ttl, label)
  local fence, decimal = next_fence(fence_key, floor_key)
  redis.call('SET', lock, owner .. ':' .. decimal .. ' ' .. label, 'PX', ttl)
  return fence
end
