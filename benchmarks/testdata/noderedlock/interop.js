// The node-redlock side of TestInterop_nodeRedlock (benchmarks/noderedlock_test.go):
// npm "redlock" 4.2.0 over ioredis takes and gives back the lock on RESOURCE
// (its key, as node-redlock names it) on the given nodes, one attempt at a
// time, until DURATION_MS has passed. While it holds, it counts itself in on
// the marker key (INCR, then DECR on MARKER_ADDR): a count above 1 means two
// holders at once. It prints one JSON line: its acquisitions, the overlaps
// it saw, and the errors of its unlocks.
//
//   node interop.js ADDR,ADDR,... RESOURCE DURATION_MS TTL_MS MARKER_ADDR MARKER_KEY
'use strict';
const Redis = require('ioredis');
const Redlock = require('redlock');

const [addrs, resource, durationMs, ttlMs, markerAddr, markerKey] = process.argv.slice(2);
const client = (addr) => {
  const [host, port] = addr.split(':');
  return new Redis({ host, port: Number(port), maxRetriesPerRequest: 1, enableOfflineQueue: true });
};
const nodes = addrs.split(',').map(client);
const marker = client(markerAddr);
const redlock = new Redlock(nodes, { retryCount: 0, driftFactor: 0.01 });
redlock.on('clientError', () => {});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

(async () => {
  const end = Date.now() + Number(durationMs);
  let acquired = 0, overlaps = 0, unlockErrors = 0, refused = 0;
  while (Date.now() < end) {
    let lock;
    try {
      lock = await redlock.lock(resource, Number(ttlMs));
    } catch (e) {
      refused++;
      await sleep(2 + Math.random() * 8);
      continue;
    }
    acquired++;
    if ((await marker.incr(markerKey)) !== 1) {
      overlaps++;
    }
    await sleep(2);
    await marker.decr(markerKey);
    try {
      await lock.unlock();
    } catch (e) {
      unlockErrors++;
    }
  }
  console.log(JSON.stringify({ acquired, overlaps, unlockErrors, refused }));
  await Promise.all([...nodes, marker].map((c) => c.quit()));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
