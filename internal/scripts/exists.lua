-- exists.lua: KEYS => [lock key]; ARGV => []
-- Returns 1 when the lock key is held, whoever holds it, 0 when it is absent
-- or only left by a release (a tombstone or a handoff marker). A key of
-- another type counts as held. It is a script, not a plain EXISTS, so that
-- the library needs only script commands.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return 1
end
if v == false or string.sub(v, 1, 10) == '<released>' or string.sub(v, 1, 9) == '<handoff>' then
  return 0
end
return 1
