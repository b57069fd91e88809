-- queue.lua: prepended to acquire.lua and release.lua (one script each).
-- KEYS[3] is the waiter queue of the lock: members "client/ttl ms/token",
-- scored by the ticket their Lock call took once (older goes first).
--
-- serve hands the lock key, which the caller may give away (it is free, or
-- holds the caller's token), to the first waiter in the queue, unless the
-- caller goes first: the queue is empty, its head is the caller's own
-- member (me), or the caller's ticket is older than the head's (with
-- orequal, also when the tickets are equal). The key is set to the head's
-- token for that waiter's TTL, the head leaves the queue, and its client
-- is told on its channel with the token as message. wake is "1" or "0",
-- then the channel prefix (the channel is prefix .. client): with "1", a
-- waiter whose client does not listen on this node (no SUBSCRIBE to its
-- channel here: its process is gone, or its connection is) is dropped from
-- the queue and the next one is tried, so that a dead waiter costs nobody a
-- wait. Who listens is read before the key is touched (PUBSUB NUMSUB: this
-- node's subscribers, not pattern subscribers), and a message is only ever
-- sent after the key is set, never undone: a waiter told by a node holds
-- the key there. "0" is for Redis Cluster nodes, where a Client's channel
-- lives on another shard than the key and cannot be counted from here: the
-- head is handed the key without that check. At most 16 heads are tried in
-- one call (a bound on the script's time): behind 16 dead waiters the key
-- is left to the caller, and later releases or attempts drop the rest.
-- Returns true when the key was handed over; otherwise the key is as it was.
local function serve(me, ticket, orequal, wake)
  local count = string.sub(wake, 1, 1) == '1'
  local prefix = string.sub(wake, 2)
  -- With no condition on the head, take it out as it is read.
  local pop = (me == nil or me == '') and not ticket
  for _ = 1, 16 do
    local first
    if pop then
      first = redis.call('ZPOPMIN', KEYS[3])[1]
      if not first then
        break
      end
    else
      local h = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
      first = h[1]
      if not first or first == me then
        break
      end
      if ticket then
        local t = tonumber(h[2])
        if ticket < t or (orequal and ticket == t) then
          break
        end
      end
      redis.call('ZREM', KEYS[3], first)
    end
    local client, ttl, token = string.match(first, '^([^/]*)/(%d+)/(.+)$')
    if client then
      local channel = prefix .. client
      if not count or redis.call('PUBSUB', 'NUMSUB', channel)[2] > 0 then
        redis.call('SET', KEYS[1], token, 'PX', ttl)
        -- A refused PUBLISH (an ACL without the channel) must not undo
        -- the handoff: the waiter's fallback attempt finds the key
        -- holding its token.
        redis.pcall('PUBLISH', channel, token)
        return true
      end
    end
  end
  return false
end
