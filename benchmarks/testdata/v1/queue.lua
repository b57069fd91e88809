-- queue.lua: prepended to acquire.lua and release.lua (one script each).
-- KEYS[3] is the waiter queue of the lock: members "client/reservation
-- ms/token", scored by the ticket their Lock call took once. KEYS[4] is a
-- hash of each member's "lapse deadline, attempt": the deadline in ms of
-- this node's clock, and the number of the waiter's latest attempt that
-- queued it (or refreshed it) here.
--
-- One total order everywhere (DESIGN step 9): (ticket, member), the order
-- of the sorted set itself. Whoever comes first in it goes first — in
-- serve's "caller goes first", in a yield, in the settlement of a split —
-- so no tie of tickets can keep two waiters apart.

-- now returns this node's time in ms, read once per script (a script
-- runs atomically: one reading serves its not-after check and the queue).
local nowMs = nil
local function now()
  if not nowMs then
    local t = redis.call('TIME')
    nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowMs
end

-- bytesLess compares two strings byte by byte, as the sorted set orders
-- its members (Lua's < follows the server's locale).
local function bytesLess(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- before reports whether (ticket, member) comes before (t, head).
local function before(ticket, member, t, head)
  return ticket < t or (ticket == t and bytesLess(member, head))
end

-- enqueue puts member in the queue with its ticket (or keeps it there:
-- its ticket does not change), and moves its lapse deadline to lapse ms
-- from now: each entry lapses on its own unless its waiter's attempts
-- refresh it. attempt is the number of the waiter's attempt that sent this
-- request: a handoff names it, so that the waiter knows the key was set
-- after that attempt began (DESIGN step 9, the grantee's validity). The two
-- keys are written together and share one TTL, which only collects them
-- once nobody waits: it is raised to twice the lapse whenever less than
-- the lapse is left (never lowered), so it outlives every live entry while
-- most attempts leave it alone.
local function enqueue(member, ticket, lapse, attempt)
  redis.call('ZADD', KEYS[3], ticket, member)
  redis.call('HSET', KEYS[4], member, (now() + lapse) .. ' ' .. attempt)
  -- The lapse hash is only written here, with the queue: its PTTL is
  -- theirs (an older client's PEXPIRE of the queue alone leaves the hash
  -- without a TTL, which this then sets).
  if redis.call('PTTL', KEYS[4]) < lapse then
    redis.call('PEXPIRE', KEYS[3], 2 * lapse)
    redis.call('PEXPIRE', KEYS[4], 2 * lapse)
  end
end

-- dequeue takes member out of the queue.
local function dequeue(member)
  if redis.call('ZREM', KEYS[3], member) == 1 then
    redis.call('HDEL', KEYS[4], member)
  end
end

-- serve hands the lock key, which the caller may give away (it is free, or
-- holds the caller's token), to the first waiter in the queue, unless the
-- caller goes first: the queue is empty, its head is the caller's own
-- member (me), or the caller (ticket, me) comes before the head in the
-- order. The key is set to the head's token for the reservation its member
-- names (a short time, far below the TTL: the waiter's own renewal extends
-- it to its TTL, so a frozen waiter holds up the next one by one
-- reservation at most), the head leaves the queue, and its client is told
-- on its channel with "token attempt" as message: the attempt that queued
-- or last refreshed the entry, which began before the key was set.
--
-- A head is skipped (dropped from the queue, the next one tried) when its
-- lapse deadline has passed (its waiter stopped attempting), or, with wake
-- "1", when its client does not listen on this node (no SUBSCRIBE to its
-- channel here: its process is gone, or its connection is). wake is "1" or
-- "0", then the channel prefix (the channel is prefix .. client). Who
-- listens is read before the key is touched (PUBSUB NUMSUB: this node's
-- subscribers, not pattern subscribers), and a message is only ever sent
-- after the key is set, never undone: a waiter told by a node holds the key
-- there. "0" is for Redis Cluster nodes, where a Client's channel lives on
-- another shard than the key and cannot be counted from here: a head is
-- handed the key without that check (a dead one costs one reservation, and
-- lapses anyway). At most 16 heads are tried in one call (a bound on the
-- script's time): behind 16 dead waiters the key is left to the caller, and
-- later releases or attempts drop the rest.
-- Returns true when the key was handed over; otherwise the key is as it was.
local function serve(me, ticket, wake)
  local count = string.sub(wake, 1, 1) == '1'
  local prefix = string.sub(wake, 2)
  local t0 = nil
  for _ = 1, 16 do
    local head
    if not ticket and (me == nil or me == '') then
      -- No condition on the head: take it out as it is read.
      head = redis.call('ZPOPMIN', KEYS[3])[1]
      if not head then
        break
      end
    else
      local h = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
      head = h[1]
      if not head or head == me then
        break
      end
      if ticket and before(ticket, me, tonumber(h[2]), head) then
        break
      end
      redis.call('ZREM', KEYS[3], head)
    end
    local field = redis.call('HGET', KEYS[4], head)
    local dl, attempt = nil, '0'
    if field then
      dl, attempt = string.match(field, '^(%d+) (%d+)$')
      redis.call('HDEL', KEYS[4], head)
    end
    t0 = t0 or now()
    local client, reserve, token = string.match(head, '^([^/]*)/(%d+)/(.+)$')
    -- An entry without a lapse (queued by an older version of the
    -- library) counts as live, attempt 0: its waiter confirms.
    if client and attempt and (not field or tonumber(dl) > t0) then
      local channel = prefix .. client
      if not count or redis.call('PUBSUB', 'NUMSUB', channel)[2] > 0 then
        redis.call('SET', KEYS[1], token, 'PX', reserve)
        -- A refused PUBLISH (an ACL without the channel) must not undo
        -- the handoff: the waiter's fallback attempt finds the key
        -- holding its token.
        redis.pcall('PUBLISH', channel, token .. ' ' .. attempt)
        return true
      end
    end
  end
  return false
end
