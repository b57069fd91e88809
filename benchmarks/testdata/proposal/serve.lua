-- serve.lua (PROTOTYPE for docs/fairness.md "Proposal"; not used by the
-- library): prepended to acquire.lua and release.lua here, as queue.lua is
-- in internal/scripts. KEYS[1] is the lock key, KEYS[3] the queue: entries
-- "client#reservation ms#token#lapse deadline#attempt" scored by ticket.

-- serve hands the key (free, or the caller's to give) to the first live
-- waiter: its entry has not lapsed by now (ms on this node's clock, or a
-- lower bound of it), and, with a channel prefix, its Client listens:
-- PUBLISH's reply counts the receivers, and a message nobody received told
-- nobody, so the key goes on to the next head (its SET replaces this one).
-- A refused PUBLISH (ACL) keeps the handoff. Returns true when handed over;
-- false when nobody was (the key may then hold a token nobody was told of:
-- the caller deletes or overwrites it).
local function serve(now, prefix)
  for _ = 1, 16 do
    local head = redis.call('ZPOPMIN', KEYS[3])[1]
    if not head then
      return false
    end
    local client, reserve, token, dl, attempt = string.match(head, '^([^#]*)#(%d+)#([^#]+)#(%d+)#(%d+)$')
    if client and tonumber(dl) > now then
      redis.call('SET', KEYS[1], token, 'PX', reserve)
      if prefix == '' then
        return true
      end
      local n = redis.pcall('PUBLISH', prefix .. client, token .. ' ' .. attempt)
      if type(n) ~= 'number' or n > 0 then
        return true
      end
    end
  end
  return false
end
