-- acquire.lua: KEYS => [lock key, fence key (only with fencing)]
--              ARGV => [token, ttl in ms, waiter ("1" or "0")]
-- Sets the lock key to our token for ttl where it is free, or refreshes it
-- where it already holds our token (a retried attempt is idempotent).
-- Free means absent, or left by a release (see release.lua): a tombstone
-- "<released>TOKEN" is free for any other token but never again for the
-- token it names, so a request of ours that arrives after our own release
-- cannot set the key again; a marker "<handoff>TOKEN" is free only for a
-- waiter (ARGV[3] == "1"), so a holder that releases and locks again at once
-- cannot starve the waiters it just woke.
-- Returns 1 (granted) or 0 (held by another token); with a fence key,
-- {granted, the node's fence counter}, from every node, granted or not.
-- GET raises WRONGTYPE on a key of another type: SET NX alone would answer
-- nil there, which would read as "held by another" instead of a node error.
local v = redis.call('GET', KEYS[1])
local free = v == false
if not free then
  if string.sub(v, 1, 10) == '<released>' then
    free = string.sub(v, 11) ~= ARGV[1]
  elseif string.sub(v, 1, 9) == '<handoff>' then
    free = ARGV[3] == '1' and string.sub(v, 10) ~= ARGV[1]
  end
end
local ok = 0
if free then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  ok = 1
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ok = 1
end
if KEYS[2] then
  return {ok, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return ok
