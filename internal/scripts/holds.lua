-- holds.lua: KEYS => [lock key]; ARGV => [token]
-- Returns 1 when the lock key holds token, 0 otherwise. It writes nothing:
-- Resume asks it of every node before its extension round, so that a
-- refused Resume (an expired, released or never-issued token) sets no key
-- anywhere, and absent nodes are healed only once a majority confirmed the
-- token (DESIGN step 4).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
