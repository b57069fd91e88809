-- extend.lua: KEYS => [lock key, fence key (only with fencing)]
--             ARGV => [token, ttl in ms, fence t (only with fencing)]
-- Re-arms the lease only where the key holds our token (returns 1), and sets
-- it again where the key is free (returns 2: the node restarted empty, or
-- the key expired there, or another client's release left it; like acquire,
-- this never takes a key that another token holds). Our own release's
-- tombstone is not free: an extension that arrives after our release must
-- not bring the key back. Returns 0 otherwise. With a fence key, wherever it
-- re-arms or heals it also raises the fence counter to t, so a node that
-- restarted empty carries the current counter again.
local v = redis.call('GET', KEYS[1])
local r = 0
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  r = 1
else
  local free = v == false
  if not free then
    local tomb = string.sub(v, 1, 10) == '<released>' and string.sub(v, 11)
    local mark = string.sub(v, 1, 9) == '<handoff>' and string.sub(v, 10)
    local left = tomb or mark
    free = left and left ~= ARGV[1] or false
  end
  if free then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    r = 2
  end
end
if r > 0 and KEYS[2] then
  local c = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tonumber(ARGV[3]) > c then
    redis.call('SET', KEYS[2], ARGV[3])
  end
end
return r
