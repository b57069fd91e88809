package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws one status line on stderr, redrawn in place a few times a
// second when stderr is a terminal; otherwise (or with -progress off) it
// prints nothing, so that logs stay clean. -progress on forces it.
type progress struct {
	w  io.Writer
	on bool

	stopc chan struct{}
	wg    sync.WaitGroup
}

func newProgress(w io.Writer, mode string) *progress {
	on := mode == "on"
	if mode == "auto" {
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				on = true
			}
		}
	}
	return &progress{w: w, on: on}
}

// start begins redrawing the line for one run until stop.
func (p *progress) start(label string, d time.Duration, ops *atomic.Int64) {
	if !p.on {
		return
	}
	p.stopc = make(chan struct{})
	begin := time.Now()
	p.wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			el := time.Since(begin)
			n := ops.Load()
			rate := 0.0
			if el > 0 {
				rate = float64(n) / el.Seconds()
			}
			fmt.Fprintf(p.w, "\r\033[K%s  %s  %4.1fs/%.1fs  %d ops  %.0f ops/s", label, bar(el, d, 20), el.Seconds(), d.Seconds(), n, rate)
			select {
			case <-p.stopc:
				return
			case <-t.C:
			}
		}
	})
}

func (p *progress) stop() {
	if !p.on || p.stopc == nil {
		return
	}
	close(p.stopc)
	p.wg.Wait()
	p.stopc = nil
}

// done clears the line.
func (p *progress) done() {
	if p.on {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// bar draws a progress bar of width cells for el out of d.
func bar(el, d time.Duration, width int) string {
	k := width
	if d > 0 && el < d {
		k = int(float64(width) * float64(el) / float64(d))
	}
	b := make([]rune, width)
	for i := range b {
		if i < k {
			b[i] = '█'
		} else {
			b[i] = '░'
		}
	}
	return string(b)
}
