-- withdraw.lua: KEYS => [identity key, withdrawn key, lock key]; ARGV => [identity value, floor in ms]
-- Marks the term withdrawn on this node — the withdrawn key holds its
-- identity value, for the lock key's remaining TTL and at least the floor,
-- so that proclaim.lua writes nothing for it any more — then deletes the
-- identity key only while it still holds our value (a term is unique to one
-- holding), so that a deposed holder can never erase its successor.
-- Returns 1 when deleted, 0 otherwise.
local px = math.max(redis.call('PTTL', KEYS[3]), tonumber(ARGV[2]))
redis.call('SET', KEYS[2], ARGV[1], 'PX', px)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
