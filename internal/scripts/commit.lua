-- commit.lua: KEYS => [lock key, fence key]; ARGV => [token, fence t]
-- Phase 2 of a fenced acquire: raises the node's fence counter to
-- max(counter, t), only while the lock key still holds our token, so that a
-- commit can never land after our key expired or was taken over. Returns 1
-- when committed, 0 when the key is not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) > c then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
