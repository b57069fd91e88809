-- release.lua: KEYS => [lock key, guard key]
--              ARGV => [token, guard ms ("0": no guard), wake-up channel
--                       ("" for none), cluster ("1": PUBSUB NUMSUB sees only
--                       this node's subscribers, so publish regardless)]
-- Check-and-delete: the lock key is deleted only while it holds our token
-- (returns 1, or 2 when the wake-up message could not be published; 0 when
-- the key is absent or holds another token). Deleted, not replaced: any
-- Redlock client of the same key (redsync, node-redlock) can take it at once.
--
-- With guard ms, the guard key is set for that long whatever the lock key
-- holds: a request of ours still in flight (an acquire or extend that timed
-- out on a slow or paused node) that reaches the node after this release
-- finds it and sets nothing (see acquire.lua, extend.lua). The guard lives
-- beside the lock key, so nobody else is kept waiting by it.
local r = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  r = 1
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
-- Only a release that freed the key wakes anyone: a failed attempt's
-- cleanup passes no channel. The message says how many clients are waiting
-- on this node (PUBSUB NUMSUB; 2 when that cannot be read), so that a lone
-- waiter attempts at once and competing ones can let the longest waiter go
-- first. A PUBLISH that fails (an ACL without the channel, say) must not
-- keep the lock from being released: 2 is returned, so the client can
-- report it; waiters then fall back to polling.
if r == 1 and ARGV[3] ~= '' then
  local subs = 2
  if ARGV[4] ~= '1' then
    local n = redis.pcall('PUBSUB', 'NUMSUB', ARGV[3])
    if type(n) == 'table' and n[2] then
      subs = tonumber(n[2]) or 2
    end
  end
  -- Nobody listening (the common, uncontended case): no message at all.
  if subs > 0 and type(redis.pcall('PUBLISH', ARGV[3], tostring(subs))) ~= 'number' then
    return 2
  end
end
return r
