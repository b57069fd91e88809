-- release.lua (PROTOTYPE for docs/fairness.md "Proposal"; not used by the
-- library): release and serve under the proposed protocol, to measure what
-- each path costs a node (benchmarks/paths_test.go). Yields, the guard and
-- old-format entries are left out.
-- KEYS => [lock key, guard key, queue]
-- ARGV => [token, our entry ("" unless we may still be queued here),
--          channel prefix ("" on Cluster: nobody is counted), node now
--          (the releaser's lower bound on this node's clock, ms)]
-- Returns 0 (not ours), 1 (deleted) or 2 (handed to the head waiter).
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
for _ = 1, 16 do
  local head = redis.call('ZPOPMIN', KEYS[3])[1]
  if not head then
    break
  end
  local client, reserve, token, dl, attempt = string.match(head, '^([^#]*)#(%d+)#([^#]+)#(%d+)#(%d+)$')
  if client and tonumber(dl) > tonumber(ARGV[4]) then
    redis.call('SET', KEYS[1], token, 'PX', reserve)
    if ARGV[3] == '' then
      return 2
    end
    -- PUBLISH says how many listened: none means nobody was told, so the
    -- handoff can go on to the next waiter (its SET replaces this one). A
    -- refused PUBLISH (ACL) keeps the handoff: the waiter's fallback
    -- attempt finds its token.
    local n = redis.pcall('PUBLISH', ARGV[3] .. client, token .. ' ' .. attempt)
    if type(n) ~= 'number' or n > 0 then
      return 2
    end
  end
end
redis.call('DEL', KEYS[1])
return 1
