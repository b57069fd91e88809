-- rw_extend.lua: after rw.lua. ARGV => as extend.lua: [token, ttl in ms,
-- fence t (0 without fencing), not after (node TIME in ms; "0": none)].
-- Re-arms our grant (returns 1), or sets it again where it is gone (2:
-- the node restarted empty, or it expired there) when the rule lets a
-- holder in: a reader where no writer holds the key, a writer where the
-- key is free and no reader is live. Waiters are not asked: we hold the
-- lock, as extend.lua heals whatever is queued. Returns 0 otherwise, and
-- where our release's guard exists; -1 past the not-after bound (late, as
-- in extend.lua). A writer with a fence key raises the counter to t
-- wherever it re-arms or heals.
if tonumber(ARGV[4]) > 0 and now() > tonumber(ARGV[4]) then
  return -1
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
prune()
local token, ttl = ARGV[1], tonumber(ARGV[2])
local v = redis.call('GET', KEYS[1])
local r = 0
if MODE == 'r' then
  if v == false or v == MARKER then
    r = 2
    if redis.call('ZSCORE', KEYS[3], token) then
      r = 1
    end
    redis.call('ZADD', KEYS[3], now() + ttl, token)
    arm()
  end
else
  if v == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    r = 1
  elseif v == false and liveReaders() == 0 then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    r = 2
  end
  if r > 0 and KEYS[6] then
    local c = tonumber(redis.call('GET', KEYS[6]) or '0')
    if tonumber(ARGV[3]) > c then
      redis.call('SET', KEYS[6], ARGV[3])
    end
  end
end
return r
