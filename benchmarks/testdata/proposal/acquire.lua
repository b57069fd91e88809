-- acquire.lua (PROTOTYPE for docs/fairness.md "Proposal"; not used by the
-- library): the paths of a plain acquire under the proposed protocol, to
-- measure what each costs a node (benchmarks/paths_test.go). Fencing,
-- yields and old-format entries are left out.
-- KEYS => [lock key, guard key, queue]
-- ARGV => [token, ttl ms, entry ("" when not queueing), ticket, queue ttl
--          ms, entry to replace ("" for none), not after (node ms)]
-- An entry is "client#reservation ms#token#lapse deadline#attempt": the
-- client computes the deadline from the request's not-after bound, so the
-- whole string is known to it (to replace or remove it) and no hash sits
-- beside the queue. '#', not '/', so that a script of today's format skips
-- such an entry instead of reading a wrong token from it.
local kg = redis.call('MGET', KEYS[1], KEYS[2])
if kg[2] then
  return 0 -- a released token is granted nothing and never queues
end
local v = kg[1]
if v ~= false and v ~= ARGV[1] and ARGV[3] == '' then
  -- Held by another and we do not queue: this request changes nothing,
  -- late or not, so its not-after bound need not be read.
  return 0
end
-- From here the request may write: its not-after bound decides.
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[7]) then
  return -2
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v == false then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head or head == ARGV[3] then
    if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then
      if head then
        redis.call('ZREM', KEYS[3], head)
      end
      return 1
    end
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
  -- (a free key with others queued first goes to the head: serve, as in
  -- release.lua; left out of this prototype)
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[6])
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
-- The queue's TTL only collects it once nobody waits: raised to the queue
-- ttl (twice the entry lapse) when less than half of it is left, never
-- lowered, so most attempts only read it. (PEXPIRE … GT would write it
-- every time, and cannot set a first TTL: it takes a key without one for
-- an infinite TTL.)
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) / 2 then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return 0
