-- acquire.lua: KEYS => [lock key, guard key, fence key (only with fencing)]
--              ARGV => [token, ttl in ms]
-- Sets the lock key to our token for ttl where it is absent, or refreshes it
-- where it already holds our token (a retried attempt is idempotent). The
-- guard key exists only after a release of this token (see release.lua): a
-- request of ours that reaches the node after our own release — delayed on
-- the way, or queued on a paused node — finds it and sets nothing, whatever
-- the lock key holds by then.
-- Returns 1 (granted) or 0 (held by another token, or released by us); with
-- a fence key, {granted, the node's fence counter}, from every node,
-- granted or not.
-- GET raises WRONGTYPE on a key of another type: SET NX alone would answer
-- nil there, which would read as "held by another" instead of a node error.
local v = redis.call('GET', KEYS[1])
local ok = 0
if v == false then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    ok = 1
  end
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ok = 1
end
if KEYS[3] then
  return {ok, tonumber(redis.call('GET', KEYS[3]) or '0')}
end
return ok
