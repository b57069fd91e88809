-- exists.lua: KEYS => [lock key]; ARGV => []
-- Returns 1 when the lock key exists, whoever holds it (a key of another
-- type counts as held), 0 when it is absent. It is a script, not a plain
-- EXISTS, so that the library needs only script commands.
return redis.call('EXISTS', KEYS[1])
