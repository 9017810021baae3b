package backfillotel_test

import (
	"context"
	"fmt"
	"strings"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	backfillotel "github.com/pgbackfill/backfill/contrib/otel"
)

// A Runner traced with OpenTelemetry. Here the providers are the SDK's
// with an in-memory exporter and a manual reader, and the Runner runs on
// the backfilltest fakes; in production pass the providers of your
// exporters (or none: the global ones) and a PostgreSQL database.
func Example() {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tracer, err := backfillotel.New(backfillotel.WithTracerProvider(tp), backfillotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}

	m := backfilltest.NewMerger()
	m.AddTable("orders", []string{"order_no"}, "order_no", "amount")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		// SerialExtract: one chunk at a time, so the phases print in a
		// fixed order (extracting ahead, the next chunk's interleave).
		Manifest: backfilltest.NewManifest(), Merger: m, Tracer: tracer, SerialExtract: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := backfill.Job{
		Name:     "orders",
		Chunker:  backfill.IntRange(0, 20, 10),
		Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for n := c.Lo; n < c.Hi; n++ {
				if err := w.Write(ctx, fmt.Sprintf("A-%d", n), "9.90"); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "orders", Key: []string{"order_no"}, Columns: []string{"order_no", "amount"}},
	}
	if _, err := r.Run(ctx, job); err != nil {
		fmt.Println(err)
		return
	}

	// The spans of the first chunk, in the order they ended.
	var names []string
	for _, s := range exp.GetSpans() {
		if s.Name != "backfill.chunk" && s.Name != "backfill.run" && len(names) < 7 {
			names = append(names, strings.TrimPrefix(s.Name, "backfill."))
		}
	}
	fmt.Println(strings.Join(names, ", "))

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == "backfill.rows" {
				for _, p := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					if v, _ := p.Attributes.Value("backfill.outcome"); v.AsString() == "inserted" {
						fmt.Println("rows inserted:", p.Value)
					}
				}
			}
		}
	}
	// Output:
	// claim, extract, stage, merge, validate, checkpoint, commit
	// rows inserted: 20
}
