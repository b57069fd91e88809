-- acquire.lua: KEYS => [lock key, guard key, queue, queue lapse hash, fence
--                       key (only with fencing)]
--              ARGV => [token, ttl in ms, member ("" when not waiting),
--                       ticket, entry lapse in ms, wake-up argument (see serve),
--                       attempt number (see enqueue), followed by "n" when
--                       no request of this member was sent before (no
--                       entry of ours can be here: none is looked for),
--                       not after (the node's TIME in ms past which this
--                       request changes nothing; "0": no bound)]
-- Sets the lock key to our token for ttl where it is absent and the queue
-- lets us go first, or refreshes it where it already holds our token (a
-- retried attempt is idempotent, and a key handed to us by a release is
-- ours already).
--
-- The guard key exists only after a release of this token (see release.lua):
-- a request of ours that reaches the node after our own release — delayed on
-- the way, or queued on a paused node — finds it and changes nothing: a
-- released token is granted nothing, refreshes nothing, and never joins the
-- queue (a release would otherwise hand the key to it).
--
-- Waiters queue (DESIGN step 9): a free key goes to the first waiter in the
-- queue (see serve), unless we go first in the order (ticket, member). A
-- waiter refused here joins the queue in the same step (or stays: its
-- ticket does not change), and its entry's lapse deadline moves to the
-- entry lapse from now (see enqueue). A waiter that was dropped (its entry
-- lapsed, or its client was not listening) joins again, with its ticket,
-- on its next attempt.
-- Returns 1 (granted) or 0 (refused), or -2 (late, below); with a fence key,
-- {that reply, the node's fence counter}, from every node, granted or not.
-- A key of another type is a node error (WRONGTYPE), never taken over.
-- One MGET reads the key and our guard (see release.lua).
--
-- Not after (DESIGN step 4): the client stopped waiting for this request
-- once the node's clock passed ARGV[8] (its deadline, mapped to the node's
-- clock with the offset's error and the drift allowed; see
-- redlock/clock.go). A request that runs later — held by the network, or
-- queued in a paused node's socket for any length of time — is refused
-- before anything is written: no grant, no refresh, no queue entry. It
-- answers -2, not 0, where it could have written: a client whose timer
-- fired late (a loaded machine) still reads the reply. Where nothing could
-- be written (the key another's and no queueing, or our guard there) the
-- bound is not read (one TIME less): the refusal is 0, a true reply of
-- the node when the request ran.
local kg = redis.call('MGET', KEYS[1], KEYS[2])
local v = kg[1]
local ok = 0
local member = ARGV[3]
-- A request that can write nothing — our guard is there, or another
-- token holds the key and we do not queue — reads no TIME: late or not,
-- it changes nothing (issue 32: a refused TryLock costs MGET alone).
if not kg[2] and (v == false or v == ARGV[1] or member ~= '') then
  if tonumber(ARGV[8]) > 0 then
    if now() > tonumber(ARGV[8]) then
      if KEYS[5] then
        return {-2, tonumber(redis.call('GET', KEYS[5]) or '0')}
      end
      return -2
    end
  end
  local p, ticket, attempt, fresh = '', nil, nil, nil
  if member ~= '' then
    attempt, fresh = string.match(ARGV[7], '^(%d+)(n?)$')
    p, ticket = prefixOf(member), tonumber(ARGV[4])
  end
  if v == false then
    -- MGET reads a key of another type as nil: it is found before
    -- anything is set (SET NX refuses it; EXISTS finds it).
    if not redis.call('ZRANGE', KEYS[3], 0, 0)[1] then
      -- Nobody queued: the key is ours.
      if not redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
      ok = 1
    else
      if redis.call('EXISTS', KEYS[1]) == 1 then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
      if not serve(p, ticket, ARGV[6], ARGV[1]) then
        -- Ours (this SET replaces a token serve set that nobody heard).
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        ok = 1
        if p ~= '' and fresh ~= 'n' then
          dequeue(p, ticket)
        end
      end
    end
  elseif v == ARGV[1] then
    -- Ours already (a handoff dequeued us, or an earlier grant did).
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    ok = 1
  end
  if ok == 0 and p ~= '' then
    enqueue(p, ticket, tonumber(ARGV[5]), attempt, fresh == 'n', ARGV[4])
  end
end
if KEYS[5] then
  return {ok, tonumber(redis.call('GET', KEYS[5]) or '0')}
end
return ok
