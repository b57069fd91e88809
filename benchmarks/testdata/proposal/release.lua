-- release.lua (PROTOTYPE for docs/fairness.md "Proposal"; not used by the
-- library; serve.lua is prepended): release and serve under the proposed
-- protocol, to measure what each path costs a node
-- (benchmarks/paths_test.go, cycle_test.go). Yields, the guard and
-- old-format entries are left out.
-- KEYS => [lock key, guard key, queue]
-- ARGV => [token, our entry ("" unless we may still be queued here),
--          channel prefix ("" on Cluster: nobody is counted), node now (the
--          releaser's lower bound on this node's clock, ms, for the lapse)]
-- Returns 0 (not ours), 1 (deleted) or 2 (handed to the first live waiter).
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if serve(tonumber(ARGV[4]), ARGV[3]) then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
