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
-- (lock key .. ":queue:lapse"), and read an entry of the new form as
-- malformed and drop it. These scripts read both forms (and take an old
-- entry's field out of the hash), and write the old form, hash field
-- included, while the hash exists: an old version queued a waiter on
-- this key within its last two lapses (only old scripts raise the hash's
-- TTL), so an old release may serve the queue, and must find our waiters
-- in a form it reads (else it drops them at the head and hands the key to
-- its own: issue 32, TestMixedVersions). Once no old process queues here,
-- the hash expires and every entry written is of the new form. A waiter's
-- own entry is found in either form (mine). One waiter may be in one form
-- on one node and in the other on another: the order holds, as entries of
-- two clients differ first within the client id (UUIDs, one length), and
-- a client queues one waiter per key at a time (redlock's line).
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

-- oldOf returns the old form "client/reservation/token" of an entry
-- prefix (no part of it contains '#' or '/').
local function oldOf(p)
  return (string.gsub(p, '#', '/'))
end

-- inForm returns the caller's prefix p in the form of head, so that the
-- order between the two is the one the sorted set keeps between their
-- entries of one form (whichever form each node holds them in).
local function inForm(p, head)
  if string.find(head, '/', 1, true) then
    return oldOf(p)
  end
  return p
end

-- prefixOf returns the entry prefix "client#reservation#token" of a member
-- "client/reservation/token" ("" for none). One check without captures and
-- one string made (each string a script makes costs the node its hashing
-- and its collection): the client and the reservation hold no '/', so the
-- first two are the separators.
local function prefixOf(member)
  if not string.find(member, '^[^/#]*/%d+/.') then
    return ''
  end
  return (string.gsub(member, '/', '#', 2))
end

-- mine reports whether head is an entry of the waiter whose prefix is p,
-- in either form.
local function mine(head, p)
  if p == '' then
    return false
  end
  if string.sub(head, 1, #p + 1) == p .. '#' then
    return true
  end
  return string.find(head, '/', 1, true) ~= nil and head == oldOf(p)
end

-- dequeue takes the entries of member (its prefix p) out of the queue:
-- they carry its ticket, so the entries with that score are all there is
-- to read (one, as a rule).
local function dequeue(p, ticket)
  for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], ticket, ticket)) do
    if mine(e, p) then
      redis.call('ZREM', KEYS[3], e)
      if string.find(e, '/', 1, true) then
        redis.call('HDEL', KEYS[4], e) -- the old form's field
      end
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
-- While the old form's hash exists (PTTL not -2: an old version queues on
-- this key), the entry is written in the old form, its field in the hash,
-- whose TTL is left to the old scripts (set here only if it has none: a
-- hash left by a version before those), so that it lapses once they stop.
-- score is the ticket as the client sent it (a string): ZADD takes it as
-- it is, and the deadline is written with %d, because a Lua number made
-- into a string goes through the C library's floating-point formatting,
-- which for numbers this long costs the node more than the ZADD itself
-- (issue 32; the same digits either way).
local function enqueue(p, ticket, lapse, attempt, fresh, score)
  if not fresh then
    dequeue(p, ticket)
  end
  local dl = string.format('%d', now() + lapse)
  local hashTTL = redis.call('PTTL', KEYS[4])
  if hashTTL == -2 then
    redis.call('ZADD', KEYS[3], score, p .. '#' .. dl .. '#' .. attempt)
  else
    local m = oldOf(p)
    redis.call('ZADD', KEYS[3], score, m)
    redis.call('HSET', KEYS[4], m, dl .. ' ' .. attempt)
    if hashTTL == -1 then
      redis.call('PEXPIRE', KEYS[4], 2 * lapse)
    end
  end
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
      if ticket and before(ticket, inForm(p, head), tonumber(h[2]), head) then
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
