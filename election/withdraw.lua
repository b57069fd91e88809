-- withdraw.lua: KEYS => [identity key]; ARGV => [identity value]
-- Deletes the identity key only while it still holds our value (a term is
-- unique to one campaign), so that a deposed leader can never erase its
-- successor. Returns 1 when deleted, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
