-- rw_release.lua: after rw.lua. ARGV => as release.lua: [token, guard ms
-- ("0": no guard), member ("" for none), wake-up prefix (unused), yield
-- ticket ("" unless yielding), entry lapse in ms, attempt (unused), not
-- after (yielding only)].
-- Gives up our grant: a reader leaves the readers (the key's MARKER then
-- lasts until the latest reader left, or goes with the last one); a
-- writer deletes the key where it holds our token. Returns 1 when we held
-- it here, else 0. Our waiter entry goes too, unless yielding (a failed
-- attempt giving its grants back between two attempts: it stays queued,
-- its place kept). With guard ms, the token's guard is set whatever the
-- key holds, as in release.lua, so a request of ours landing later sets
-- nothing. Then the waiters whose turn it may be are told (see wake in
-- rw.lua), so that they attempt at once.
-- A yield past its not-after bound (ARGV[8], as in release.lua) changes
-- nothing and returns -1 (late).
if ARGV[5] ~= '' and ARGV[8] and tonumber(ARGV[8]) > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[8]) then
    return -1
  end
end
prune()
local token = ARGV[1]
local me = ''
if ARGV[3] ~= '' then
  me = MODE .. ARGV[3]
end
local r = 0
if MODE == 'r' then
  if redis.call('ZREM', KEYS[3], token) == 1 then
    r = 1
  end
  local v = redis.call('GET', KEYS[1])
  if v == false or v == MARKER then
    arm()
  end
elseif redis.call('GET', KEYS[1]) == token then
  redis.call('DEL', KEYS[1])
  r = 1
end
if me ~= '' then
  if ARGV[5] ~= '' and redis.call('EXISTS', KEYS[2]) == 0 then
    enqueue(me, tonumber(ARGV[5]), tonumber(ARGV[6]))
  else
    dequeue(me)
  end
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
if r == 1 or me ~= '' then
  wake(ARGV[4])
end
return r
