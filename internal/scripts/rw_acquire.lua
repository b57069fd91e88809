-- rw_acquire.lua: after rw.lua. ARGV => as acquire.lua: [token, ttl in ms,
-- member ("" when not waiting), ticket, entry lapse in ms, wake-up
-- argument (unused), attempt number (unused), not after (node TIME in
-- ms; "0": no bound)].
-- Grants the reader or writer (MODE) by the rule in rw.lua, or refreshes a
-- grant it holds already (a retried attempt is idempotent). A refused
-- waiter joins the waiters, or refreshes its entry; a granted one leaves
-- them. Where our release's guard exists (a request landing after our
-- release) nothing changes. Returns 1 or 0, or -2 past the not-after bound
-- (late, as in acquire.lua); with a fence key (writers), {that reply, the
-- node's fence counter}. A key of another type is a node
-- error (WRONGTYPE, from GET or ZADD), never taken over.
local function reply(ok)
  if KEYS[6] then
    return {ok, tonumber(redis.call('GET', KEYS[6]) or '0')}
  end
  return ok
end
if tonumber(ARGV[8]) > 0 and now() > tonumber(ARGV[8]) then
  return reply(-2)
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return reply(0)
end
prune()
local token, ttl = ARGV[1], tonumber(ARGV[2])
local me = ''
if ARGV[3] ~= '' then
  me = MODE .. ARGV[3]
end
local ticket = tonumber(ARGV[4])
local v = redis.call('GET', KEYS[1])
local ok = 0
if MODE == 'r' then
  if v == false or v == MARKER then
    if redis.call('ZSCORE', KEYS[3], token) or not blocked(me, ticket) then
      redis.call('ZADD', KEYS[3], now() + ttl, token)
      arm()
      ok = 1
    end
  elseif IGNORE_WRITER then
    -- The negative control's bug only (testhooks.ReaderIgnoresWriter):
    -- granted beside a writer.
    redis.call('ZADD', KEYS[3], now() + ttl, token)
    ok = 1
  end
else
  if v == token then
    redis.call('PEXPIRE', KEYS[1], ttl)
    ok = 1
  elseif v == false and liveReaders() == 0 and not blocked(me, ticket) then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    ok = 1
  end
end
if me ~= '' then
  if ok == 1 then
    dequeue(me)
  else
    enqueue(me, ticket, tonumber(ARGV[5]))
  end
end
return reply(ok)
