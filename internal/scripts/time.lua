-- time.lua: KEYS => [a key of the slot]; ARGV => []
-- Returns TIME of the server that serves the key's slot: [seconds,
-- microseconds]. It is a keyed script, not a plain TIME (which has no key),
-- so that a Redis Cluster runs it on the key's master, whose clock the
-- key's scripts read. It reads and writes no key.
return redis.call('TIME')
