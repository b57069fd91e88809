-- release.lua: KEYS => [lock key]
--              ARGV => [token, wake-up channel ("" for none), handoff ms,
--                       tombstone ms, cluster ("1": PUBSUB NUMSUB sees only
--                       this node's subscribers, so publish regardless)]
-- Check-and-delete: only while the key holds our token (returns 1, or 2 when
-- the wake-up message could not be published; 0 when the key is absent or
-- holds another token). It publishes on the wake-up channel, so
-- waiting clients retry at once instead of polling. When some client is
-- subscribed there and handoff ms > 0, the key is not deleted but replaced
-- by a short-lived marker that only a waiter may take: the releasing client
-- cannot take the lock back before the waiters it just woke.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
-- The message says how many clients are waiting on this node (PUBSUB
-- NUMSUB; 2 when that cannot be read), so that a lone waiter attempts at
-- once and competing ones can let the longest waiter go first.
-- A PUBLISH that fails (an ACL without the channel, say) must not keep the
-- lock from being released: the key is deleted anyway and 2 is returned,
-- so the client can report it; waiters then fall back to polling.
local n = 0
local published = true
if ARGV[2] ~= '' then
  local subs = 2
  if ARGV[5] ~= '1' then
    local r = redis.pcall('PUBSUB', 'NUMSUB', ARGV[2])
    if type(r) == 'table' and r[2] then
      subs = tonumber(r[2]) or 2
    end
  end
  -- Nobody listening (the common, uncontended case): no message at all.
  if subs > 0 then
    n = redis.pcall('PUBLISH', ARGV[2], tostring(subs))
    if type(n) ~= 'number' then
      n, published = 0, false
    end
  end
end
-- The key is not deleted but left as a tombstone naming our token, for
-- tombstone ms (the lock's TTL): free for every other client, it keeps a
-- request of ours still in flight (an acquire or extend that timed out on a
-- paused node, say) from setting the key again after this release.
if n > 0 and tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], '<handoff>' .. ARGV[1], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], '<released>' .. ARGV[1], 'PX', ARGV[4])
end
if not published then
  return 2
end
return 1
