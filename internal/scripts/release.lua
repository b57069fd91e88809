-- release.lua: KEYS => [lock key, guard key, queue, queue expiries]
--              ARGV => [token, guard ms ("0": no guard), member ("" for none),
--                       reservation ms, wake-up channel prefix, yield ticket
--                       ("" unless yielding), queue entry lifetime in ms]
-- Releases our key (DESIGN steps 4, 6 and 9) and reports what became of it:
-- 0 the key was not ours; 1 deleted (nobody queued: any Redlock client of
-- the key, redsync or node-redlock, can take it at once); 2 handed to the
-- first in the queue: the key is set to that waiter's token for a short
-- reservation, which the waiter's confirming attempt extends to its TTL (a
-- waiter that went away delays the next one by the reservation at most),
-- and that waiter's client alone is told, on its channel (prefix + client),
-- with the token as message; 3 kept (yielding only, see below).
--
-- Our member leaves the queue, whether we held the key or not, so that no
-- handoff lands on a token that is done.
--
-- Yielding (a waiter that won only a minority of nodes in a split vote, with
-- its ticket): the key is handed to an older waiter queued here, or kept
-- when there is none, and we stay queued. Split votes so settle toward the
-- oldest ticket.
--
-- With guard ms, the guard key is set for that long whatever the lock key
-- holds: a request of ours still in flight (an acquire or extend that timed
-- out on a slow or paused node) that reaches the node after this release
-- finds it and sets nothing (see acquire.lua, extend.lua). The guard lives
-- beside the lock key, so nobody else is kept waiting by it.
if ARGV[3] ~= '' then
  dequeue(ARGV[3])
end
local r = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local first, ticket = head()
  if ARGV[6] ~= '' and (not first or tonumber(ARGV[6]) <= ticket) then
    r = 3
  elseif first then
    local client, token = string.match(first, '^(.-)/(.*)$')
    redis.call('SET', KEYS[1], token or first, 'PX', ARGV[4])
    dequeue(first)
    if client then
      -- A refused PUBLISH (an ACL without the channel) must not undo the
      -- handoff: the waiter's fallback attempt finds the key holding its
      -- token and confirms it.
      redis.pcall('PUBLISH', ARGV[5] .. client, token)
    end
    r = 2
  else
    redis.call('DEL', KEYS[1])
    r = 1
  end
end
if ARGV[6] ~= '' and r ~= 3 and ARGV[3] ~= '' then
  enqueue(ARGV[3], ARGV[6], ARGV[7])
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return r
