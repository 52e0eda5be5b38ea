-- The wait line and the watchers, shared by the scripts that grant or free
-- (prepended to each). All keys share the name's hash tag:
--   lock  "<owner>:<fence> <label>", PX = TTL
--   queue zset of waiters; member "<wait id>:<claim window ms>[c]:<channel>",
--         score = arrival order (tail + 1)
--   next  the member a free lock is reserved for, PX = its claim window
--   offers  hash of the waiters' standing offers (see handoff.lua)
--   watchers  set of instance channels that asked for one "changed" message
-- A channel is one backend instance's own pub/sub channel; the instance
-- wakes the one local wait the member names.
--
-- The line is wake-up bookkeeping, not lock state: its writes go through
-- line_call, which keeps them out of the AOF (and replicas), so joining the
-- line or claiming a hand-off costs no fsync. The lock and fence keys are
-- written with redis.call and stay exactly as durable as before. A restart
-- may forget or keep a line; waiters then rejoin at their next re-check.

-- redis.call for a line key (queue or next), not propagated.
local function line_call(...)
  redis.set_repl(redis.REPL_NONE)
  local reply = redis.call(...)
  redis.set_repl(redis.REPL_ALL)
  return reply
end

-- Hands a free lock to the first waiter in line that can still hear it:
-- pops the head and, with `grant` (see offer_grant in handoff.lua; nil for
-- none) and a fresh standing offer from that waiter, grants it the lock
-- there and then. Otherwise PUBLISHes "<member> <lock key>" to its
-- instance's channel and reserves the lock for it for its claim window.
-- A head whose instance has no subscriber (gone) is dropped and the next
-- one tried. The caller's
-- own entry (`me`, '' for none) is not woken but reported, so the caller can
-- take the lock itself. Callers make sure no reservation stands (a held
-- lock never has one: only the reserved waiter can take a reserved lock).
-- Returns 'granted' (the lock is the head's now), 'reserved' (a woken
-- waiter will claim), 'me' or 'none'.
local function wake_next(lock_key, queue_key, next_key, me, grant)
  if redis.call('EXISTS', queue_key) == 0 then
    return 'none' -- nobody waits: one read, no line work
  end
  -- Bounded work per call: beyond this many gone waiters, the next call
  -- (any acquire that finds the lock free) carries on.
  for _ = 1, 64 do
    local member = line_call('ZPOPMIN', queue_key)[1]
    if not member then
      return 'none'
    end
    if member == me then
      return 'me'
    end
    -- A window ending in 'c': the waiter's instance listens on a Redis
    -- Cluster node, maybe another one, and PUBLISH counts only this node's
    -- subscribers. Such a waiter is trusted to hear; if it is gone, the
    -- reservation lapses after its window and the next attempt carries on.
    local window, elsewhere, channel = string.match(member, '^%d+:(%d+)(c?):(%S+)$')
    window = tonumber(window)
    local handed = window and window > 0 and elsewhere == '' and grant
      and grant(lock_key, member, channel)
    if handed == 'granted' then
      return 'granted'
    end
    if window and window > 0 and not handed
        and (redis.call('PUBLISH', channel, member .. ' ' .. lock_key) > 0
             or elsewhere == 'c') then
      line_call('SET', next_key, member, 'PX', window)
      return 'reserved'
    end
  end
  return 'none'
end

-- Tells every instance watching `key` (a lock key or a semaphore's slots)
-- that it may have become free: one "changed <key>" message per instance,
-- which wakes its local watches of that key. Registrations are one-shot.
local function wake_watchers(key, watchers_key)
  local channels = redis.call('SMEMBERS', watchers_key)
  if #channels == 0 then
    return
  end
  line_call('DEL', watchers_key)
  for _, channel in ipairs(channels) do
    redis.call('PUBLISH', channel, 'changed ' .. key)
  end
end

-- The lock `lock_key` was just freed: wakes the watchers and the first
-- waiter in line. One read when nobody waits or watches.
local function freed(lock_key, queue_key, next_key, watchers_key, grant)
  if redis.call('EXISTS', queue_key, watchers_key) == 0 then
    return
  end
  wake_watchers(lock_key, watchers_key)
  wake_next(lock_key, queue_key, next_key, '', grant)
end
