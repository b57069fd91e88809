package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quorumlock/quorumlock/internal/scripts"
)

// TestClassify is the node layer's one rule for a failed request: it
// counts as never sent only when it provably wrote no byte.
func TestClassify(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	cases := []struct {
		name               string
		err                error
		neverWrote, unsent bool
		answered, replied  bool
		kind               string // the FailureKind() the error carries (NodeError.Kind reads it), "" for none
	}{
		{"nil", nil, false, false, true, true, ""},
		{"pool closed", redis.ErrClosed, true, false, false, false, ""},
		{"error reply", fmt.Errorf("wrapped: %w", errReply("WRONGTYPE x")), false, false, true, true, ""},
		{"late", scripts.ErrLate, false, false, true, true, ""},
		{"dial refused", dial, true, false, false, false, ""},
		{"dial refused, marked unsent", neverSent(dial), true, true, true, false, ""},
		{"dial after a pipeline wrote", mayHaveLanded(dial), false, false, false, false, ""},
		{"timeout", context.DeadlineExceeded, false, false, false, false, ""},
		{"eof", io.EOF, false, false, false, false, ""},
		{"busy", errBusy, false, true, true, false, "busy"},
		{"busy, wrapped", fmt.Errorf("node 2: %w", errBusy), false, true, true, false, "busy"},
		{"down", &connError{Err: dial, notSent: true}, true, true, true, false, "connection"},
		{"timeout while dials fail", &connError{Err: fmt.Errorf("%w (its dials fail; %v)", dial, context.DeadlineExceeded)}, true, false, false, false, "connection"},
		{"stuck", &stuckError{}, false, true, true, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := neverWrote(tc.err); got != tc.neverWrote {
				t.Errorf("neverWrote(%v) = %v; want %v", tc.err, got, tc.neverWrote)
			}
			if got := unsent(tc.err); got != tc.unsent {
				t.Errorf("unsent(%v) = %v; want %v", tc.err, got, tc.unsent)
			}
			if got := Answered(tc.err); got != tc.answered {
				t.Errorf("Answered(%v) = %v; want %v", tc.err, got, tc.answered)
			}
			if got := replied(tc.err); got != tc.replied {
				t.Errorf("replied(%v) = %v; want %v", tc.err, got, tc.replied)
			}
			got := "" // none
			var k interface{ FailureKind() string }
			if errors.As(tc.err, &k) {
				got = k.FailureKind()
			}
			if got != tc.kind {
				t.Errorf("FailureKind() carried by %v = %q; want %q", tc.err, got, tc.kind)
			}
		})
	}
	// The case of issue 30 item 6: a timeout while the node's dials fail
	// is wrapped with the dialer's error, and must still "may have landed".
	h := &health{dials: &dialState{}}
	h.dials.set(dial)
	if err := h.Cause(context.DeadlineExceeded); unsent(err) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Cause(timeout) while dials fail = %v (unsent %v); want the dialer's error, not unsent", err, unsent(err))
	}
}

type errReply string

func (e errReply) Error() string { return string(e) }
func (errReply) RedisError()     {}
