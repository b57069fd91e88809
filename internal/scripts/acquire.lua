-- acquire.lua: KEYS => [lock key, guard key, queue, queue expiries,
--                       fence key (only with fencing)]
--              ARGV => [token, ttl in ms, member ("" when not waiting),
--                       ticket, queue entry lifetime in ms]
-- Sets the lock key to our token for ttl where it is absent, or refreshes it
-- where it already holds our token (a retried attempt is idempotent, and a
-- key handed to us by a release is ours to confirm).
--
-- The guard key exists only after a release of this token (see release.lua):
-- a request of ours that reaches the node after our own release — delayed on
-- the way, or queued on a paused node — finds it and changes nothing.
--
-- Waiters queue (DESIGN step 9): the queue is a sorted set of members
-- ("client/token") scored by their ticket, taken once per Lock call; the
-- expiries set scores each member by when it lapses (node time, ms), so a
-- waiter that went away leaves the queue. A free key goes to the first in
-- the queue: a caller is granted it when the queue is empty, when it is the
-- head, or when its ticket is older than the head's. A waiter refused here
-- joins the queue (or stays in it, its entry renewed) in the same step.
-- Returns 1 (granted) or 0 (refused); with a fence key, {granted, the node's
-- fence counter}, from every node, granted or not.
-- GET raises WRONGTYPE on a key of another type: SET NX alone would answer
-- nil there, which would read as "held by another" instead of a node error.
local v = redis.call('GET', KEYS[1])
local ok = 0
-- A released token is dead here, whatever the key holds: it is granted
-- nothing, refreshes nothing, and never joins the queue (a release would
-- otherwise hand the key to it).
local guarded = redis.call('EXISTS', KEYS[2]) == 1
if guarded then
  -- nothing
elseif v == false then
  do
    local free = true
    local first, ticket = head()
    if first and first ~= ARGV[3] then
      free = ARGV[3] ~= '' and tonumber(ARGV[4]) < ticket
    end
    if free then
      redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
      ok = 1
    end
  end
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ok = 1
end
if ARGV[3] ~= '' and not guarded then
  if ok == 1 then
    dequeue(ARGV[3])
  else
    enqueue(ARGV[3], ARGV[4], ARGV[5])
  end
end
if KEYS[5] then
  return {ok, tonumber(redis.call('GET', KEYS[5]) or '0')}
end
return ok
