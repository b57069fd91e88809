-- sample.lua: ARGV => [lock key pattern, guard suffix]
-- The chaos sampler's read of one node: the value and PTTL of every lock
-- key (fence counters and release guards aside), in one atomic step:
-- {value, pttl, value, pttl, ...}. The nodes of a chaos run hold a few keys
-- per resource, so KEYS is cheap here.
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  if k:sub(-6) ~= ':fence' and not k:find(ARGV[2], 1, true)
      and redis.call('TYPE', k).ok == 'string' then
    out[#out + 1] = redis.call('GET', k)
    out[#out + 1] = redis.call('PTTL', k)
  end
end
return out
