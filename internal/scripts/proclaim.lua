-- proclaim.lua: KEYS => [lock key, identity key, withdrawn key]; ARGV => [lock token, identity value, not after]
-- Writes a holder's identity (an election's leader, a qlock permit's
-- holder: identity.go) beside its lock key, only while the lock key holds
-- the holder's token, with the lock key's remaining TTL: the identity
-- can never outlive the lease it describes on this node. Nothing once the
-- term's withdraw (withdraw.lua) has run here: a write of the term that
-- lands after its withdraw, still in flight when the round was decided,
-- cannot set the identity again. Not after (DESIGN step 4, as in
-- acquire.lua): a write that runs once the node's clock passed ARGV[3] (ms;
-- "0" or absent: no bound), after its sender stopped waiting for it,
-- writes nothing either. Returns 1 when written, 0 when the lock key is
-- not ours (or has no TTL left), the term was withdrawn, or it ran late.
if redis.call('GET', KEYS[3]) == ARGV[2] then
  return 0
end
local notAfter = tonumber(ARGV[3] or '0')
if notAfter > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > notAfter then
    return 0
  end
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
return 1
