-- extend.lua: KEYS => [lock key, guard key, fence key (only with fencing)]
--             ARGV => [token, ttl in ms, fence t (0 without fencing),
--                      not after (node TIME in ms; "0": no bound)]
-- Re-arms the lease only where the key holds our token (returns 1), and sets
-- it again where the key is absent (returns 2: the node restarted empty, or
-- the key expired there; like acquire, this never takes a key that another
-- token holds). Where our release's guard key exists, the lock was released:
-- an extension that arrives after the release must not bring the key back.
-- Returns 0 otherwise. With a fence key, wherever it re-arms or heals it
-- also raises the fence counter to t, so a node that restarted empty carries
-- the current counter again.
--
-- Not after (DESIGN step 4, as in acquire.lua): past ARGV[4] on the node's
-- clock the client no longer waits for this request, which then changes
-- nothing and returns -1 (late: not a refusal, see acquire.lua).
if tonumber(ARGV[4]) > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then
    return -1
  end
end
local v = redis.call('GET', KEYS[1])
local r = 0
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- released here: a late extension changes nothing
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  r = 1
elseif v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  r = 2
end
if r > 0 and KEYS[3] then
  local c = tonumber(redis.call('GET', KEYS[3]) or '0')
  if tonumber(ARGV[3]) > c then
    redis.call('SET', KEYS[3], ARGV[3])
  end
end
return r
