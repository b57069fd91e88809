-- queue.lua: prepended to acquire.lua and release.lua (one script each).
-- KEYS[3] is the waiter queue (members by ticket), KEYS[4] the members by
-- when their entry lapses, in ms of the node's clock.
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
-- head drops the lapsed members and returns the first one and its ticket
-- (nil when nobody waits).
local function head()
  if redis.call('ZCARD', KEYS[3]) == 0 then
    return nil
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', clock())) do
    redis.call('ZREM', KEYS[3], m)
    redis.call('ZREM', KEYS[4], m)
  end
  local h = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  return h[1], tonumber(h[2])
end
-- enqueue puts member in the queue with its ticket, or renews its entry.
local function enqueue(member, ticket, lapse)
  redis.call('ZADD', KEYS[3], ticket, member)
  redis.call('ZADD', KEYS[4], clock() + tonumber(lapse), member)
  redis.call('PEXPIRE', KEYS[3], lapse)
  redis.call('PEXPIRE', KEYS[4], lapse)
end
local function dequeue(member)
  redis.call('ZREM', KEYS[3], member)
  redis.call('ZREM', KEYS[4], member)
end
