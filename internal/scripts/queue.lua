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
-- is told on its channel (prefix .. client) with the token as message. A
-- waiter whose client is not listening on this node (PUBLISH reaches
-- nobody: its process is gone, or its connection is) is dropped from the
-- queue and the next one is tried, so that a dead waiter costs nobody a
-- wait. Returns true when the key was handed over; otherwise the key is
-- put back as it was (back: the caller's token and its PTTL, or nil for an
-- absent key).
local function serve(me, ticket, orequal, prefix, back)
  local tried = false
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
      -- The key first, then the message: a waiter told it holds the key
      -- here always does.
      redis.call('SET', KEYS[1], token, 'PX', ttl)
      tried = true
      local n = redis.pcall('PUBLISH', prefix .. client, token)
      if type(n) == 'number' and n > 0 then
        return true
      end
    end
  end
  if tried then
    if back then
      redis.call('SET', KEYS[1], back[1], 'PX', back[2])
    else
      redis.call('DEL', KEYS[1])
    end
  end
  return false
end
