-- extend.lua: KEYS => [lock key]; ARGV => [token, ttl in ms]
-- Re-arms the lease only where the key holds our token (returns 1), and sets
-- it again where the key is absent (returns 2: the node restarted empty or
-- the key expired there; like acquire, this can never take a key that
-- another token holds). Returns 0 when another token holds the key.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
