-- exists.lua: KEYS => [lock key]; ARGV => []
-- Returns 1 when a lock key exists, whoever holds it, 0 otherwise. It is a
-- script, not a plain EXISTS, so that the library needs only script commands.
return redis.call('EXISTS', KEYS[1])
