-- release.lua: KEYS => [lock key, guard key, queue]
--              ARGV => [token, guard ms ("0": no guard), member ("" for none),
--                       wake-up channel prefix, yield ticket ("" unless
--                       yielding), queue lifetime in ms]
-- Releases our key (DESIGN steps 4, 6 and 9) and reports what became of it:
-- 0 the key was not ours; 1 deleted (nobody queued: any Redlock client of
-- the key, redsync or node-redlock, can take it at once); 2 handed to the
-- first waiter in the queue whose client listens (see serve): the key holds
-- that waiter's token for its TTL, and that client alone is told; 3 kept
-- (yielding only, see below).
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
  redis.call('ZREM', KEYS[3], ARGV[3])
end
local r = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[5] ~= '' then
    if serve(nil, tonumber(ARGV[5]), true, ARGV[4]) then
      r = 2
    else
      r = 3
    end
  elseif serve(nil, nil, false, ARGV[4]) then
    r = 2
  else
    redis.call('DEL', KEYS[1])
    r = 1
  end
end
-- A yielding waiter stays queued, unless the token was released here
-- already (a yield that landed late, after the call gave up): a released
-- token never queues again.
if ARGV[5] ~= '' and r ~= 3 and ARGV[3] ~= '' and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
return r
