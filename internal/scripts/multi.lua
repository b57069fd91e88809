-- multi.lua: the multi-resource lock (issue 24 item 3), one script per
-- operation, selected by the line prepended before it: OP = 'acquire',
-- 'extend' or 'release'.
-- KEYS => [lock key 1, ..., lock key K, guard key (of the first resource,
--          for our token)]
-- ARGV => acquire: as acquire.lua (token, ttl in ms, ..., not after at 8);
--         extend: as extend.lua (token, ttl in ms, fence t, not after);
--         release: as release.lua (token, guard ms, ...).
-- All or none on this node: acquire sets every key to our token (or
-- refreshes those that hold it) only when each is free or ours; extend
-- re-arms or heals them all only when none holds another token; release
-- deletes each that holds our token. Each key is a plain lock key, so a
-- Lock of one of the resources (or redsync, node-redlock on it) excludes
-- the multi-lock and is excluded by it. Where our release's guard exists,
-- acquire and extend change nothing; past the not-after bound they change
-- nothing either and answer as acquire.lua (-2) and extend.lua (-1) do. A key of another type is a node
-- error (WRONGTYPE from GET).
local n = #KEYS - 1
local token, guard = ARGV[1], KEYS[#KEYS]
local function late(bound)
  if tonumber(bound) > 0 then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(bound)
  end
  return false
end
if OP == 'release' then
  local r = 0
  for i = 1, n do
    if redis.call('GET', KEYS[i]) == token then
      redis.call('DEL', KEYS[i])
      r = 1
    end
  end
  if ARGV[2] ~= '0' then
    redis.call('SET', guard, '1', 'PX', ARGV[2])
  end
  return r
end
local bound = ARGV[8]
if OP == 'extend' then
  bound = ARGV[4]
end
if late(bound) then
  -- late (as in acquire.lua and extend.lua): not a refusal
  if OP == 'extend' then
    return -1
  end
  return -2
end
if redis.call('EXISTS', guard) == 1 then
  return 0
end
local absent = 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v == false then
    absent = absent + 1
  elseif v ~= token then
    return 0
  end
end
for i = 1, n do
  redis.call('SET', KEYS[i], token, 'PX', ARGV[2])
end
if OP == 'extend' and absent > 0 then
  return 2
end
return 1
