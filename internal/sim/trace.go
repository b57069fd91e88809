package sim

import (
	"context"

	"github.com/quorumlock/quorumlock/redlock"
)

// tracer records what a Client's hooks report into the history, for the
// report of a failing seed (Plan.Trace).
type tracer struct {
	redlock.NoHooks
	h *History
	c int
}

func (t tracer) Attempt(_ context.Context, i redlock.AttemptInfo) {
	t.h.Note("c%d attempt %s call %d: %s, %d of %d granted, handoff %v, node errors %d", t.c, i.Resource, i.Call, i.Outcome, i.Granted, i.Nodes, i.Handoff, len(i.NodeErrors))
}

func (t tracer) Acquire(_ context.Context, i redlock.AcquireInfo) {
	t.h.Note("c%d acquire %s call %d lock %d: %s after %d attempts, fence %d", t.c, i.Resource, i.Call, i.Lock, i.Outcome, i.Attempts, i.Fence)
}

func (t tracer) Extend(_ context.Context, i redlock.ExtendInfo) {
	t.h.Note("c%d extend %s lock %d renewal %v: %d confirmed, %d healed, err %v", t.c, i.Resource, i.Lock, i.Renewal, i.Confirmed, i.Healed, i.Err != nil)
}

func (t tracer) Lost(_ context.Context, i redlock.LostInfo) {
	t.h.Note("c%d lost %s lock %d: %v", t.c, i.Resource, i.Lock, firstLine(i.Err))
}

func (t tracer) Release(_ context.Context, i redlock.ReleaseInfo) {
	t.h.Note("c%d release %s lock %d: %d released, was lost %v", t.c, i.Resource, i.Lock, i.Released, i.WasLost)
}

func (t tracer) NodeError(_ context.Context, i redlock.NodeErrorInfo) {
	t.h.Note("c%d node error %s %s n%d: %s %v", t.c, i.Resource, i.Op, i.Node, i.Kind, firstLine(i.Err))
}
