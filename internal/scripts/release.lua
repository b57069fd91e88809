-- release.lua: KEYS => [lock key]
--              ARGV => [token, wake-up channel ("" for none), handoff ms]
-- Check-and-delete: only while the key holds our token (returns 1; 0 when it
-- is absent or holds another token). It publishes on the wake-up channel, so
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
local n = 0
if ARGV[2] ~= '' then
  local subs = 2
  local r = redis.pcall('PUBSUB', 'NUMSUB', ARGV[2])
  if type(r) == 'table' and r[2] then
    subs = tonumber(r[2]) or 2
  end
  n = redis.call('PUBLISH', ARGV[2], tostring(subs))
end
if n > 0 and tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], '<handoff>', 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
