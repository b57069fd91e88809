package redlockotel_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quorumlock/quorumlock/otel"
	"github.com/quorumlock/quorumlock/redlock"
)

// nodes starts n in-process Redis nodes whose TTLs run in real time, and
// returns a client for each and a function that stops them all.
func nodes(n int) ([]redis.UniversalClient, func()) {
	var clients []redis.UniversalClient
	var servers []*miniredis.Miniredis
	for range n {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true)
		if err := m.Start(); err != nil {
			panic(err)
		}
		servers = append(servers, m)
		clients = append(clients, redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}))
	}
	return clients, func() {
		for i := range clients {
			clients[i].Close()
			servers[i].Close()
		}
	}
}

func Example() {
	nodes, stop := nodes(3)
	defer stop()
	// In a service, install the SDK's providers with otel.SetTracerProvider
	// and otel.SetMeterProvider, and call redlockotel.New without them.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	hooks, err := redlockotel.New(redlockotel.WithTracerProvider(tp), redlockotel.WithMeterProvider(mp),
		redlockotel.WithResourceAttribute(redlockotel.ResourcePrefix(":"))) // "invoice", not one series per invoice
	if err != nil {
		panic(err)
	}
	client, err := redlock.New(nodes, redlock.WithHooks(hooks))
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx, span := tp.Tracer("billing").Start(context.Background(), "charge")
	lock, err := client.Lock(ctx, "invoice:1234") // spans: children of "charge"
	if err != nil {
		panic(err)
	}
	if err := lock.Unlock(ctx); err != nil {
		panic(err)
	}
	span.End()

	for _, s := range spans.Ended() {
		fmt.Println("span", s.Name())
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "redlock.hold.duration" {
			fmt.Println(m.Name, "count", h.DataPoints[0].Count)
		}
	}
	// Output:
	// span redlock.attempt
	// span redlock.acquire
	// span redlock.release
	// span charge
	// redlock.hold.duration count 1
}
