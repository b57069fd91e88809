package quorum

import (
	"time"
)

// Tally is the state of a round when it was decided.
type Tally struct {
	Yes, No, Failed, Pending int
	Votes                    []Vote  // per node; Pending for a node whose reply was not waited for
	Errs                     []error // per node; the error of a Failed node
	// Cut is set for a Failed node that was cut short because the caller's
	// ctx ended before the node timeout: the caller gave up on it, which
	// says nothing about the node. Nil when there is none.
	Cut     []bool
	Elapsed time.Duration
}

// CutShort returns how many Failed nodes were cut short by the caller.
func (t Tally) CutShort() int {
	n := 0
	for _, c := range t.Cut {
		if c {
			n++
		}
	}
	return n
}

func (t *Tally) cut(i int) {
	if t.Cut == nil {
		t.Cut = make([]bool, len(t.Votes))
	}
	t.Cut[i] = true
}

// Record counts node i's vote v in t, with err for a Failed one, in place
// of what t held for it (Pending, as a rule): every tally's counts are
// made here. A vote other than Yes or No counts as Failed.
func (t *Tally) Record(i int, v Vote, err error) {
	switch t.Votes[i] {
	case Pending:
		t.Pending--
	case Yes:
		t.Yes--
	case No:
		t.No--
	default:
		t.Failed--
	}
	t.count(i, v, err)
}

// Counted returns the tally of votes (one per node) and their errors.
func Counted(votes []Vote, errs []error) Tally {
	t := Tally{Votes: votes, Errs: errs}
	for i, v := range votes {
		t.count(i, v, errs[i])
	}
	return t
}

func (t *Tally) count(i int, v Vote, err error) {
	switch v {
	case Pending:
		t.Pending++
	case Yes:
		t.Yes++
	case No:
		t.No++
	default:
		v = Failed
		t.Failed++
	}
	t.Votes[i], t.Errs[i] = v, err
}

// Quorum reports whether a majority voted yes.
func (t Tally) Quorum() bool { return t.Yes >= Size(len(t.Votes)) }

// Decider says whether a tally settles the round. See [Majority] and [All].
type Decider func(t Tally) bool

// Majority settles a round as soon as a majority voted yes, or a majority of
// yes votes has become impossible.
func Majority(t Tally) bool {
	q := Size(len(t.Votes))
	return t.Yes >= q || t.Yes+t.Pending < q
}

// All settles a round only when every node has answered.
func All(t Tally) bool { return t.Pending == 0 }

func (t *Tally) failPending(err error, cut bool) {
	for i, v := range t.Votes {
		if v == Pending {
			t.Record(i, Failed, err)
			if cut {
				t.cut(i)
			}
		}
	}
}
