-- leave.lua: KEYS => [lock key, guard key, queue, queue lapse hash]
--            ARGV => [member]
-- Prepended by queue.lua. Takes member out of the queue and nothing else:
-- Detach sends it, since the lock's next owner (Resume) does not know the
-- member its Lock call queued, and could not take it out at its release
-- (DESIGN step 4: a handed-over lock carries its queue membership or
-- gives it up).
dequeue(ARGV[1])
return 1
