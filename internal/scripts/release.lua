-- release.lua: KEYS => [lock key]; ARGV => [token]
-- Check-and-delete: deletes the key only while it holds our token (returns 1);
-- returns 0 when it is absent or holds another token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
