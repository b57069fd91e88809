-- guard.lua: run before acquire.lua, in the same script (AcquireGuarded);
--            ARGV[9] => the restart guard (ARGV[8] is
--            acquire's not-after bound), in whole seconds.
-- Restart guard: a node that restarted may have lost keys it had granted,
-- so it grants nothing until it has been up for longer than any lease it
-- could have granted before. Until then it returns {-1, its uptime in
-- seconds} and changes nothing: the acquire below does not run. The uptime
-- is read in the same atomic step as the grant. Redis reports it as a
-- difference of whole seconds of its clock (now and start, each rounded
-- down), which may exceed the time really elapsed by up to a second: so it
-- must exceed the guard, not merely reach it.
do
  local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
  if up == nil then
    return redis.error_reply('ERR restart guard: no uptime_in_seconds in INFO server')
  end
  if up <= tonumber(ARGV[9]) then
    return {-1, up}
  end
end
