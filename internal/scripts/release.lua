-- release.lua: KEYS => [lock key, guard key, queue, queue lapse hash]
--              ARGV => [token, guard ms ("0": no guard), member ("" for none),
--                       wake-up channel prefix, yield ticket ("" unless
--                       yielding), entry lapse in ms, "attempt ticket"
--                       (the attempt number, yielding: the attempt whose
--                       grants we yield; and our ticket, which finds our
--                       entry), not after (yielding only; node TIME in ms)]
-- Releases our key (DESIGN steps 4, 6 and 9) and reports what became of it:
-- 0 the key was not ours; 1 deleted (nobody queued: any Redlock client of
-- the key, redsync or node-redlock, can take it at once); 2 handed to the
-- first live waiter in the queue (see serve): the key holds that waiter's
-- token for its short reservation, and that client alone is told; 3 kept
-- (yielding only, see below).
--
-- Our member leaves the queue, whether we held the key or not, so that no
-- handoff lands on a token that is done. It is looked for only where the
-- key is not ours (see below), and the client sends the member only where
-- an entry of ours may still be ("" where a handoff took it out and no
-- request of ours may land since). A key that is gone already (our
-- lease ran out here) is free: it goes to the first live waiter, as an
-- acquire that finds it free would do, so that waiters need not wait for
-- their fallback attempt to learn of it.
--
-- Yielding (a waiter that won only a minority of nodes in a split vote, with
-- its ticket): the key is handed to a waiter queued here that comes before
-- us in the order (ticket, member), or kept when there is none, and we stay
-- queued. Split votes so settle toward the first in the order.
--
-- With guard ms, the guard key is set for that long whatever the lock key
-- holds: a request of ours still in flight (an acquire or extend that timed
-- out on a slow or paused node) that reaches the node after this release
-- finds it and sets nothing (see acquire.lua, extend.lua). The guard lives
-- beside the lock key, so nobody else is kept waiting by it.
-- A yield carries a not-after bound (ARGV[8], node TIME in ms; DESIGN
-- step 4, as in acquire.lua): past it, the client no longer waits for it
-- and may have released the lock since, so it changes nothing and returns
-- -1 (late). Without the bound, a yield held in the network until the
-- release's guard expired would queue a finished token again.
if ARGV[5] ~= '' and ARGV[8] and tonumber(ARGV[8]) > 0 and now() > tonumber(ARGV[8]) then
  return -1
end
local member = ARGV[3]
local attempt, tk = nil, nil
if member ~= '' then
  attempt, tk = string.match(ARGV[7], '^(%d+) (%d+)$')
end
local v = redis.call('GET', KEYS[1])
-- Where the key holds our token no entry of ours is queued: whatever set
-- it to our token took our entry out (a grant dequeues, a handoff pops),
-- and while it holds our token nothing queues us again (an attempt
-- refreshes instead; a yield keeps the key without queueing, or gives it
-- away first). So the lookup is only where the key is not ours.
local p = ''
if member ~= '' then
  p = prefixOf(member)
  if v ~= ARGV[1] then
    dequeue(p, tonumber(tk))
  end
end
local ticket = nil
if ARGV[5] ~= '' then
  ticket = tonumber(ARGV[5])
end
local r = 0
if v == ARGV[1] then
  if ticket then
    if serve(p, ticket, ARGV[4], ARGV[1]) then
      r = 2
    else
      -- Kept by a yielding waiter, which holds only a minority: for the
      -- reservation its member names, not the TTL, so that a waiter that
      -- freezes now holds up the others for one reservation at most (its
      -- next attempt re-arms the key to the TTL). SET, not PEXPIRE: serve
      -- may have set the key to a waiter nobody heard.
      local reserve = string.match(member, '^[^/]*/(%d+)/')
      if reserve then
        redis.call('SET', KEYS[1], ARGV[1], 'PX', reserve)
      end
      r = 3
    end
  elseif serve('', nil, ARGV[4], ARGV[1]) then
    r = 2
  else
    redis.call('DEL', KEYS[1])
    r = 1
  end
elseif v == false and not ticket then
  local handed, set = serve('', nil, ARGV[4], ARGV[1])
  if not handed and set then
    redis.call('DEL', KEYS[1]) -- set to a waiter nobody heard: free again
  end
end
-- A yielding waiter stays queued, unless the token was released here
-- already (a yield that landed late, after the call gave up): a released
-- token never queues again.
if ticket and r ~= 3 and p ~= '' and redis.call('EXISTS', KEYS[2]) == 0 then
  enqueue(p, ticket, tonumber(ARGV[6]), attempt, true, ARGV[5])
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return r
