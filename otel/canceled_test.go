package redlockotel_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quorumlock/quorumlock/otel"
	"github.com/quorumlock/quorumlock/redlock"
)

// A Lock call whose ctx was cancelled is recorded with outcome "canceled",
// not "no_quorum": the caller's cancellation is no node trouble.
func TestOutcome_canceled(t *testing.T) {
	_, nodes := miniNodes(t, 3)
	tel := newTelemetry(t)
	h, err := redlockotel.New(redlockotel.WithMeterProvider(tel.mp), redlockotel.WithTracerProvider(tel.tp))
	if err != nil {
		t.Fatal(err)
	}
	c, err := redlock.New(nodes, redlock.WithHooks(h))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Lock(ctx, "job"); err == nil {
		t.Fatal("Lock with a cancelled ctx succeeded")
	}
	ms := tel.collect(t)
	// A ctx done before the call sends no round (issue 44 item 3): no
	// acquisition round is recorded, and the call is canceled.
	if hist, ok := ms["redlock.acquire.duration"].Data.(metricdata.Histogram[float64]); ok && len(hist.DataPoints) > 0 {
		t.Errorf("redlock.acquire.duration has %d data points; want none (no round was sent)", len(hist.DataPoints))
	}
	for _, name := range []string{"redlock.wait.duration"} {
		hist, ok := ms[name].Data.(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s: no histogram", name)
		}
		var outcomes []string
		for _, dp := range hist.DataPoints {
			v, _ := dp.Attributes.Value(redlockotel.KeyOutcome)
			outcomes = append(outcomes, v.AsString())
		}
		if len(outcomes) != 1 || outcomes[0] != string(redlock.OutcomeCanceled) {
			t.Errorf("%s outcomes = %q; want [canceled]", name, outcomes)
		}
	}
}
