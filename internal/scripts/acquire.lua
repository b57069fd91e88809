-- acquire.lua: KEYS => [lock key]; ARGV => [token, ttl in ms]
-- Returns 1 when the key now holds our token for ttl (set where absent, or
-- refreshed where it already held our token, so a retried attempt is
-- idempotent), 0 when another token holds it. GET raises WRONGTYPE on a key of
-- another type: SET NX alone would answer nil there, which would read as
-- "held by another" instead of the node error it is.
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
