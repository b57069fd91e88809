-- fenced_set.lua: KEYS => [resource key (a hash)]; ARGV => [fence token, value]
-- A write to a resource protected by fencing tokens: it is applied only if
-- its token is at least the highest token the resource has seen, and then
-- the token is remembered. Older tokens — from a holder that lost its lock
-- and does not know it yet — are refused. Returns 1 when applied, 0 when
-- refused. The hash has two fields: value and fence.
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local t = tonumber(ARGV[1])
if t < seen then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return 1
