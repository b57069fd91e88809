package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestWriteSVG(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeSVG(&b, testReport()); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, with an <svg> root in the SVG namespace.
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	var root string
	paths := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Space + " " + se.Name.Local
			}
			if se.Name.Local == "path" {
				paths++
			}
		}
	}
	if want := "http://www.w3.org/2000/svg svg"; root != want {
		t.Errorf("root element = %q; want %q", root, want)
	}
	// One curve per library with samples: 3 in uncontended, 1 in contended
	// (redsync failed there).
	if paths != 4 {
		t.Errorf("SVG has %d curves; want 4", paths)
	}
	for _, want := range []string{"latency (log scale)", "share of operations", "quorumlock", "uncontended", "Redis 7.0.15, quorumlock abc123, redsync v4.18.1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestLogTicks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		lo, hi time.Duration
		want   []time.Duration
	}{
		{300 * time.Microsecond, 3 * time.Millisecond, []time.Duration{200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond}},
		{30 * time.Microsecond, 400 * time.Millisecond, []time.Duration{10 * time.Microsecond, 100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second}},
		{time.Millisecond, time.Millisecond, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
	}
	for _, tc := range cases {
		if got := logTicks(tc.lo, tc.hi); !slices.Equal(got, tc.want) {
			t.Errorf("logTicks(%v, %v) = %v; want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestFmtTick(t *testing.T) {
	t.Parallel()
	for in, want := range map[time.Duration]string{50 * time.Microsecond: "50µs", time.Millisecond: "1ms", 200 * time.Millisecond: "200ms", 2 * time.Second: "2s", 500: "500ns"} {
		if got := fmtTick(in); got != want {
			t.Errorf("fmtTick(%v) = %q; want %q", in, got, want)
		}
	}
}
