-- rw.lua: prepended to rw_acquire.lua, rw_extend.lua and rw_release.lua
-- (one script each), after a line that sets MODE to 'r' (a reader) or 'w'
-- (a writer) of a read-write lock (issue 24 item 1).
-- KEYS => [lock key, guard key, readers, waiters, waiter lapses, fence key
--          (writers with fencing only)]
--
-- On each node:
-- - a writer holds the lock key itself, with its token, as a plain lock
--   does (so redsync, node-redlock and the plain Lock of this library on
--   the same key exclude it and are excluded by it);
-- - readers are the sorted set KEYS[3], token -> expiry in ms of this
--   node's clock, and while any is live the lock key holds MARKER (not a
--   token: no release of another client matches it), with the PTTL of the
--   latest reader expiry. So a writer of any library finds the key taken,
--   and a crashed reader lapses by itself at its expiry;
-- - waiting Lock calls are KEYS[4], "r" or "w" .. member -> the call's
--   ticket, and KEYS[5], the same -> the entry's lapse deadline in ms.
--   Each entry lapses on its own unless its waiter's attempts refresh it.
--
-- The rule (fairness, both ways): a writer is granted only with no writer,
-- no live reader and no live waiter of either kind before it in the order
-- (ticket, entry); a reader only with no writer and no live waiting writer
-- before it. So a waiting writer holds off every reader that came after
-- it (no writer starvation), and the readers that came before it go first
-- (no reader starvation): the kinds take turns in arrival order, and all
-- readers between two writers share one turn. A call that does not wait
-- (TryLock, member "") comes after every waiter.
local MARKER = 'quorumlock:readers'

local nowMs = nil
local function now()
  if not nowMs then
    local t = redis.call('TIME')
    nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowMs
end

-- prune drops readers whose expiry has passed and waiters whose lapse
-- deadline has.
local function prune()
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now())
  local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now())
  if #gone > 0 then
    redis.call('ZREM', KEYS[5], unpack(gone))
    redis.call('ZREM', KEYS[4], unpack(gone))
  end
end

-- arm sets the lock key to MARKER until the latest reader expiry (and the
-- readers' set with it), or deletes both when no reader is left. The key
-- must be free or hold MARKER.
local function arm()
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if not last[1] then
    if redis.call('GET', KEYS[1]) == MARKER then
      redis.call('DEL', KEYS[1])
    end
    redis.call('DEL', KEYS[3])
    return
  end
  local left = tonumber(last[2]) - now()
  if left < 1 then
    left = 1
  end
  redis.call('SET', KEYS[1], MARKER, 'PX', left)
  redis.call('PEXPIRE', KEYS[3], left)
end

-- bytesLess compares two strings byte by byte, as a sorted set orders
-- its members.
local function bytesLess(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- blocked reports whether a live waiter comes before the caller's entry
-- (ticket, me) in the order and keeps it out: for a writer any waiter,
-- for a reader a writer. me == '' (a call that does not wait) comes after
-- everyone.
local function blocked(me, ticket)
  local es
  if me == '' then
    es = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
  else
    es = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ticket, 'WITHSCORES')
  end
  for i = 1, #es, 2 do
    local e, t = es[i], tonumber(es[i + 1])
    if e ~= me and (MODE == 'w' or string.sub(e, 1, 1) == 'w') then
      if me == '' or t < ticket or bytesLess(e, me) then
        return true
      end
    end
  end
  return false
end

-- enqueue puts the caller's entry in the waiters with its ticket (kept
-- when it is there), lapsing lapse ms from now. Both sets share a TTL of
-- twice the longest lapse (raised, never lowered), so they go once
-- nobody waits.
local function enqueue(me, ticket, lapse)
  redis.call('ZADD', KEYS[4], ticket, me)
  redis.call('ZADD', KEYS[5], now() + lapse, me)
  if redis.call('PTTL', KEYS[5]) < 2 * lapse then
    redis.call('PEXPIRE', KEYS[4], 2 * lapse)
    redis.call('PEXPIRE', KEYS[5], 2 * lapse)
  end
end

local function dequeue(me)
  redis.call('ZREM', KEYS[4], me)
  redis.call('ZREM', KEYS[5], me)
end

-- liveReaders is the number of live readers (after prune).
local function liveReaders()
  return redis.call('ZCARD', KEYS[3])
end

-- wake tells the waiters whose turn it may be now (after a release): none
-- while a writer holds the key; else the first waiter in the order if it
-- is a writer and no reader is live, or the readers before the first
-- waiting writer. Each is told on its client's channel (wake is
-- release.lua's wake-up argument: a flag, then the channel prefix) with
-- its token; the message only makes its waiter attempt at once instead of
-- after its retry delay. At most 16 are told.
local function wake(arg)
  local v = redis.call('GET', KEYS[1])
  if v ~= false and v ~= MARKER then
    return
  end
  local prefix = string.sub(arg, 2)
  local live = liveReaders() > 0
  local es = redis.call('ZRANGE', KEYS[4], 0, 15)
  for i, e in ipairs(es) do
    local kind, client, token = string.match(e, '^([rw])([^/]*)/%d+/(.+)$')
    if kind == 'w' then
      if i == 1 and not live then
        redis.pcall('PUBLISH', prefix .. client, token .. ' 0')
      end
      return
    end
    if kind then
      redis.pcall('PUBLISH', prefix .. client, token .. ' 0')
    end
  end
end
