-- acquire.lua: KEYS => [lock key, fence key (only with fencing)]
--              ARGV => [token, ttl in ms, waiter ("1" or "0")]
-- Sets the lock key to our token for ttl where it is absent, or refreshes it
-- where it already holds our token (a retried attempt is idempotent). A
-- handoff marker left by a release for waiting clients may be taken only by
-- a waiter (ARGV[3] == "1"), so a holder that releases and locks again at
-- once cannot starve the waiters.
-- Returns 1 (granted) or 0 (another token holds it); with a fence key,
-- {granted, the node's fence counter}, from every node, granted or not.
-- GET raises WRONGTYPE on a key of another type: SET NX alone would answer
-- nil there, which would read as "held by another" instead of a node error.
local v = redis.call('GET', KEYS[1])
local ok = 0
if v == false or (v == '<handoff>' and ARGV[3] == '1') then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  ok = 1
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ok = 1
end
if KEYS[2] then
  return {ok, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return ok
