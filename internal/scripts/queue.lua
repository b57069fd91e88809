-- queue.lua: prepended to acquire.lua, release.lua and leave.lua (one
-- script each). KEYS[3] is the waiter queue of the lock, a sorted set
-- scored by the ticket each Lock call took once. An entry is
-- "client#reservation ms#token#lapse deadline#attempt": the deadline in ms
-- of this node's clock past which the entry lapses, and the number of the
-- waiter's latest attempt that queued it (or refreshed it) here. A waiter
-- names itself by its member "client/reservation ms/token" (the argument
-- of the scripts); its entry is that with '#' for '/', then the deadline
-- and the attempt: the entry changes on every refresh, and the member's
-- prefix and the ticket find it.
--
-- Rolling upgrade: versions before this one wrote entries "client/
-- reservation/token" with their deadline and attempt in a hash, KEYS[4]
-- (lock key .. ":queue:lapse"). These scripts still read such entries (and
-- take them out of the hash), and write only the new form; the old
-- scripts read a new entry as malformed and drop it (its waiter queues
-- again on its next attempt, with its ticket).
--
-- One total order everywhere (DESIGN step 9): (ticket, entry), the order
-- of the sorted set itself. Whoever comes first in it goes first — in
-- serve's "caller goes first", in a yield, in the settlement of a split —
-- so no tie of tickets can keep two waiters apart. Entries of two waiters
-- differ within "client#reservation#token" (client ids and tokens are
-- UUIDs, of one length), so the part that differs from node to node (the
-- deadline) never decides between them, and a caller's member prefix
-- compares with an entry as its entry would.

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

-- prefixOf returns the entry prefix "client#reservation#token" of a member
-- "client/reservation/token" ("" for none).
local function prefixOf(member)
  local client, reserve, token = string.match(member, '^([^/#]*)/(%d+)/(.+)$')
  if not client then
    return ''
  end
  return client .. '#' .. reserve .. '#' .. token
end

-- mine reports whether head is an entry of the waiter whose prefix is p.
local function mine(head, p)
  return p ~= '' and string.sub(head, 1, #p + 1) == p .. '#'
end

-- dequeue takes the entries of member (its prefix p) out of the queue:
-- they carry its ticket, so the entries with that score are all there is
-- to read (one, as a rule).
local function dequeue(p, ticket)
  for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], ticket, ticket)) do
    if mine(e, p) then
      redis.call('ZREM', KEYS[3], e)
    end
  end
end

-- enqueue puts the waiter (prefix p) in the queue with its ticket, its
-- entry lapsing lapse ms from now, naming attempt: the number of the
-- waiter's attempt that sent this request (a handoff names it, so that the
-- waiter knows the key was set after that attempt began: DESIGN step 9,
-- the grantee's validity). An entry of an earlier request replaced (unless
-- fresh: no request of this member was sent before, so none is here). The
-- queue's TTL only collects it once nobody waits: it is raised to twice
-- the lapse whenever less than the lapse is left (never lowered), so it
-- outlives every live entry while most attempts leave it alone.
local function enqueue(p, ticket, lapse, attempt, fresh)
  if not fresh then
    dequeue(p, ticket)
  end
  redis.call('ZADD', KEYS[3], ticket, p .. '#' .. (now() + lapse) .. '#' .. attempt)
  if redis.call('PTTL', KEYS[3]) < lapse then
    redis.call('PEXPIRE', KEYS[3], 2 * lapse)
  end
end

-- entry reads a head taken out of the queue: client, reservation, token,
-- lapse deadline (nil: none) and attempt; nil for a malformed one. An
-- entry of the old form has its deadline and attempt in the hash KEYS[4]
-- (taken out of it here); one without them there counts as live, attempt
-- 0 (its waiter confirms).
local function entry(head)
  local client, reserve, token, dl, attempt = string.match(head, '^([^#/]*)#(%d+)#([^#]+)#(%d+)#(%d+)$')
  if client then
    return client, reserve, token, tonumber(dl), attempt
  end
  client, reserve, token = string.match(head, '^([^/]*)/(%d+)/(.+)$')
  if not client then
    return nil
  end
  local field = redis.call('HGET', KEYS[4], head)
  if not field then
    return client, reserve, token, nil, '0'
  end
  redis.call('HDEL', KEYS[4], head)
  local d, a = string.match(field, '^(%d+) (%d+)$')
  if not d then
    return nil
  end
  return client, reserve, token, tonumber(d), a
end

-- serve hands the lock key, which the caller may give away (it is free, or
-- holds the caller's token), to the first waiter in the queue, unless the
-- caller goes first: the queue is empty, its head is the caller's own
-- entry (p, its prefix), or the caller (ticket, p) comes before the head
-- in the order. The key is set to the head's token for the reservation its
-- entry names (a short time, far below the TTL: the waiter's own renewal
-- extends it to its TTL, so a frozen waiter holds up the next one by one
-- reservation at most), the head leaves the queue, and its client is told
-- on its channel with "token attempt" as message: the attempt that queued
-- or last refreshed the entry, which began before the key was set.
--
-- A head is skipped (dropped from the queue, the next one tried) when its
-- lapse deadline has passed (its waiter stopped attempting), or, with wake
-- "1", when its client does not listen on this node (no SUBSCRIBE to its
-- channel here: its process is gone, or its connection is). wake is "1" or
-- "0", then the channel prefix (the channel is prefix .. client). Who
-- listens is PUBLISH's own reply, the number of receivers (this node's
-- subscribers and pattern subscribers): the key is set first, then the
-- message sent, and a message nobody received told nobody, so the next
-- head's SET replaces the key (or the caller deletes or overwrites it, on
-- false). What a receiver was told is never undone: a waiter told by a
-- node holds the key there. A refused PUBLISH (an ACL without the channel)
-- keeps the handoff: the waiter's fallback attempt finds the key holding
-- its token. An entry of the caller's own token (self: one its Lock call
-- left, say, on a node that handed it the key, where its release sends no
-- member) is dropped, never handed the key it gives up. "0" is for Redis Cluster nodes, where a Client's channel
-- lives on another shard than the key and its receivers cannot be counted
-- from here: a head is handed the key without that check (a dead one costs
-- one reservation, and lapses anyway). At most 16 heads are tried in one
-- call (a bound on the script's time): behind 16 dead waiters the key is
-- left to the caller, and later releases or attempts drop the rest.
-- Returns true when the key was handed over; false, and whether the key
-- was set to a token nobody was told of (the caller then deletes it or
-- sets it again), when not.
local function serve(p, ticket, wake, self)
  local count = string.sub(wake, 1, 1) == '1'
  local prefix = string.sub(wake, 2)
  local set = false
  for _ = 1, 16 do
    local head
    if not ticket and (p == nil or p == '') then
      -- No condition on the head: take it out as it is read.
      head = redis.call('ZPOPMIN', KEYS[3])[1]
      if not head then
        break
      end
    else
      local h = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
      head = h[1]
      if not head or mine(head, p) then
        break
      end
      if ticket and before(ticket, p, tonumber(h[2]), head) then
        break
      end
      redis.call('ZREM', KEYS[3], head)
    end
    local client, reserve, token, dl, attempt = entry(head)
    if client and token ~= self and (not dl or dl > now()) then
      local channel = prefix .. client
      redis.call('SET', KEYS[1], token, 'PX', reserve)
      local n = redis.pcall('PUBLISH', channel, token .. ' ' .. attempt)
      if not count or type(n) ~= 'number' or n > 0 then
        return true
      end
      set = true
    end
  end
  return false, set
end
