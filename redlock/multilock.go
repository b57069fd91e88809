package redlock

import (
	"context"
	"slices"
	"strings"
)

// LockAll acquires a lock on every one of resources at once (issue 24
// item 3): on each node one script sets every resource's lock key to our
// token, or none of them, and a majority must grant. The one *Lock it
// returns is renewed, reported lost and unlocked for all of them
// together: it is lost when a majority no longer holds every key. Each
// key is the resource's plain lock key, so a plain Lock (or redsync,
// node-redlock, a write lock) of any one of the resources excludes the
// multi-lock and is excluded by it.
//
// No deadlock, whatever order callers list the resources in: nothing is
// ever held while waiting for more (a node grants all or nothing, and an
// attempt that won no majority gives back what it won before it waits),
// and the resources are sorted and deduplicated first. Resource returns
// them joined by ","; Resources returns them.
//
// It blocks, retrying every retry delay (a multi-lock polls: it does not
// use the wake-up queue), until granted, WithRetryCount attempts, ctx
// done or Close. Its Fence is 0 (WithFencing is ignored: fence each
// resource with its own Lock). Errors are those of Lock;
// ErrInvalidArgument also for an empty list, a bad resource name, and, on
// Redis Cluster nodes,
// resources whose keys are on different slots (a *CrossSlotError
// matching ErrCrossSlot: on Cluster each resource's key has its own hash
// tag, so in practice a multi-lock there covers one resource).
func (c *Client) LockAll(ctx context.Context, resources []string, opts ...Option) (*Lock, error) {
	return c.lockAll(ctx, resources, opts, false)
}

// TryLockAll makes one attempt at LockAll: it is refused (ErrNotObtained)
// when another owner holds any of the resources on too many nodes.
func (c *Client) TryLockAll(ctx context.Context, resources []string, opts ...Option) (*Lock, error) {
	return c.lockAll(ctx, resources, opts, true)
}

func (c *Client) lockAll(ctx context.Context, resources []string, opts []Option, once bool) (*Lock, error) {
	rs, err := c.multiResources(resources)
	if err != nil {
		return nil, err
	}
	opts = append(withMode(opts, ModeMulti), optionFunc(func(c *config) {
		c.resources = rs
		c.wakeUp = false
	}))
	return c.lock(ctx, strings.Join(rs, ","), opts, once)
}

// multiResources checks resources and returns them sorted, without
// duplicates.
func (c *Client) multiResources(resources []string) ([]string, error) {
	if len(resources) == 0 {
		return nil, invalid("LockAll: no resources")
	}
	rs := slices.Clone(resources)
	slices.Sort(rs)
	rs = slices.Compact(rs)
	for _, r := range rs {
		if err := c.checkResource(r); err != nil {
			return nil, err
		}
	}
	if !c.anyCluster {
		return rs, nil
	}
	for i := range c.nodes {
		if !c.nodes[i].Cluster {
			continue
		}
		first := -1
		for j, r := range rs {
			s := keySlot(c.nodes[i].lockKey(c.cfg.keyPrefix, r))
			if first < 0 {
				first = s
			} else if s != first {
				return nil, &CrossSlotError{A: rs[0], B: rs[j], SlotA: first, SlotB: s}
			}
		}
	}
	return rs, nil
}

// Resources returns the resources l holds: one for every kind but a
// multi-resource lock (LockAll), which holds them all. The slice is a
// copy.
func (l *Lock) Resources() []string {
	if l == nil {
		return nil
	}
	if l.cfg.mode == ModeMulti {
		return slices.Clone(l.cfg.resources)
	}
	return []string{l.resource}
}

// keySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the part between the first "{" and the next "}", when not
// empty) or of the whole key, mod 16384.
func keySlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
