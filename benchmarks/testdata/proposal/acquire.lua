-- acquire.lua (PROTOTYPE for docs/fairness.md "Proposal"; not used by the
-- library; serve.lua is prepended): the paths of a plain acquire under the
-- proposed protocol, to measure what each costs a node
-- (benchmarks/paths_test.go, cycle_test.go). Fencing, yields, the
-- WRONGTYPE checks and old-format entries are left out.
-- KEYS => [lock key, guard key, queue]
-- ARGV => [token, ttl ms, entry ("" when not queueing), ticket, queue ttl
--          ms, our entry queued here before ("" for none), not after (node
--          ms), channel prefix]
-- The client computes an entry's lapse deadline from the request's
-- not-after bound, so it knows the whole string (to replace or remove it)
-- and no hash sits beside the queue. '#', not '/', so that a script of
-- today's format skips such an entry instead of reading a wrong token.
-- Returns 1 (granted), 0 (refused; queued when an entry was given), -2
-- (late: nothing read or written past the key and guard).
local kg = redis.call('MGET', KEYS[1], KEYS[2])
if kg[2] then
  return 0 -- a released token is granted nothing and never queues
end
local v = kg[1]
local entry, prev = ARGV[3], ARGV[6]
if v ~= false and v ~= ARGV[1] and entry == '' then
  -- Held by another and we do not queue: this request changes nothing,
  -- late or not, so its not-after bound need not be read.
  return 0
end
-- From here the request may write: its not-after bound decides.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[7]) then
  return -2
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if prev ~= '' then
    redis.call('ZREM', KEYS[3], prev)
  end
  return 1
end
if v == false then
  -- A free key goes to the first in the order (ticket, member): us when
  -- the queue is empty, our entry heads it, or we come before its head
  -- (members compare within "client#reservation#token": fixed-length ids).
  local h = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local first = not h[1] or h[1] == prev
  if not first and entry ~= '' then
    local ticket, head = tonumber(ARGV[4]), tonumber(h[2])
    first = ticket < head or (ticket == head and string.match(entry, '^[^#]*#[^#]*#[^#]*') < string.match(h[1], '^[^#]*#[^#]*#[^#]*'))
  end
  if first or not serve(now, ARGV[8]) then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if prev ~= '' then
      redis.call('ZREM', KEYS[3], prev)
    end
    return 1
  end
  if entry == '' then
    return 0
  end
end
if prev ~= '' and prev ~= entry then
  redis.call('ZREM', KEYS[3], prev)
end
redis.call('ZADD', KEYS[3], ARGV[4], entry)
-- The queue's TTL only collects it once nobody waits: raised to the queue
-- ttl (twice the entry lapse) when less than half of it is left, never
-- lowered, so most attempts only read it. (PEXPIRE … GT would write it
-- every time, and cannot set a first TTL: it takes a key without one for
-- an infinite TTL.)
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) / 2 then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return 0
