package backfillotel_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	backfillotel "github.com/pgbackfill/backfill/contrib/otel"
)

func TestMain(m *testing.M) { backfilltest.PostgresMain(m) }

// itemsJob is a job of 5 chunks of 100 ids into a fresh items table.
func itemsJob(t *testing.T, db *sqlx.DB, extract func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error) backfill.Job {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE items (id bigint PRIMARY KEY, name text,
		backfill_inserted_by bigint, backfill_updated_by bigint)`); err != nil {
		t.Fatal(err)
	}
	return backfill.Job{
		Name:      "items",
		Chunker:   backfill.IntRange(0, 500, 100),
		Extractor: backfill.ExtractorFunc(extract),
		Target:    backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name"}},
	}
}

func writeIDs(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	for id := c.Lo; id < c.Hi; id++ {
		if err := w.Write(ctx, id, fmt.Sprintf("item-%d", id)); err != nil {
			return err
		}
	}
	return nil
}

// level is a throttle signal the test sets.
type level struct{ v atomic.Int64 }

func (s *level) Name() string { return "level" }
func (s *level) Read(context.Context, sqlx.ExtContext, backfillthrottle.SignalScope) (float64, error) {
	return float64(s.v.Load()), nil
}

// TestSpansAndMetricsOfARun runs a job on PostgreSQL with the adapter on
// the SDK's in-memory exporter and a manual metric reader: one run span,
// a chunk span per attempt under it with the phases in order under each,
// the failed try's span in error, and the retry, the throttle's hold and
// release as events of the run's span; metrics count the rows by
// outcome, the chunk durations, the retry by SQLSTATE, the exception and
// the time throttled.
func TestSpansAndMetricsOfARun(t *testing.T) {
	ctx := context.Background()
	db := backfilltest.NewPostgres(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tr, err := backfillotel.New(backfillotel.WithTracerProvider(tp), backfillotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	sig := &level{}
	var held atomic.Bool
	var tries sync.Map
	job := itemsJob(t, db, func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		v, _ := tries.LoadOrStore(c.Seq, new(atomic.Int64))
		n := v.(*atomic.Int64).Add(1)
		switch {
		case c.Seq == 1 && n == 1:
			return &pq.Error{Code: "40001", Message: "could not serialize access"}
		case c.Seq == 2:
			if err := w.Reject(ctx, map[string]any{"id": "x"}, "id", "not a number"); err != nil {
				return err
			}
		case c.Seq == 3:
			// A hold while this chunk runs (released once seen: holdOnce).
			sig.v.Store(50)
			for !held.Load() && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
		return writeIDs(ctx, c, w)
	})
	// Serial extraction: extracting ahead, a chunk leased while the hold
	// begins gives its lease back unattempted and is leased again, a span
	// more each time, as the timing falls; this test counts spans exactly.
	r, err := backfill.New(db, &backfill.Config{Tracer: holdOnce{tr, sig, &held}, ThrottleInterval: 10 * time.Millisecond, SerialExtract: true,
		Throttles:   []backfillthrottle.Throttle{{Signal: sig, High: 10}},
		LockRetries: []backfill.LockRetry{{Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		t.Fatal(err)
	}

	// Spans.
	spans := exp.GetSpans()
	var run tracetest.SpanStub
	chunks := map[string]tracetest.SpanStub{} // span ID -> chunk span
	for _, s := range spans {
		switch s.Name {
		case "backfill.run":
			if run.Name != "" {
				t.Fatal("two run spans")
			}
			run = s
		case "backfill.chunk":
			chunks[s.SpanContext.SpanID().String()] = s
		}
	}
	if run.Name == "" {
		t.Fatal("no run span")
	}
	if got := attr(run.Attributes, "backfill.batch_id"); got != attribute.Int64Value(rep.BatchID) {
		t.Errorf("run span batch_id = %v, want %d", got.String(), rep.BatchID)
	}
	if len(chunks) != 6 {
		t.Fatalf("%d chunk spans, want 6 (5 chunks, one tried twice)", len(chunks))
	}
	phases := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		if p, ok := chunks[s.Parent.SpanID().String()]; ok {
			phases[p.SpanContext.SpanID().String()] = append(phases[p.SpanContext.SpanID().String()], s)
		}
	}
	want := []string{"backfill.claim", "backfill.extract", "backfill.stage", "backfill.merge", "backfill.validate", "backfill.checkpoint", "backfill.commit"}
	failed := 0
	for id, c := range chunks {
		if c.Parent.SpanID() != run.SpanContext.SpanID() {
			t.Errorf("chunk span %v: parent is not the run's span", attr(c.Attributes, "backfill.chunk.id").String())
		}
		ps := phases[id]
		slices.SortFunc(ps, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		var names []string
		for i, p := range ps {
			names = append(names, p.Name)
			if i > 0 && p.StartTime.Before(ps[i-1].EndTime) {
				t.Errorf("phases %s and %s overlap", ps[i-1].Name, p.Name)
			}
			if p.StartTime.Before(c.StartTime) || p.EndTime.After(c.EndTime) {
				t.Errorf("phase %s lies outside its chunk's span", p.Name)
			}
		}
		switch attr(c.Attributes, "backfill.chunk.outcome").AsString() {
		case backfilltrace.OutcomeDone:
			// A chunk extracted ahead (the default) waits for its worker's
			// previous chunk between its extraction and its transaction:
			// a queued phase there, and only there.
			if len(names) > 2 && names[2] == "backfill.queued" {
				names = slices.Delete(slices.Clone(names), 2, 3)
			}
			if !slices.Equal(names, want) {
				t.Errorf("phases %v, want %v", names, want)
			}
		case backfilltrace.OutcomeFailed:
			failed++
			if c.Status.Code != codes.Error || len(c.Events) == 0 {
				t.Errorf("failed chunk span: status %v, %d events; want an error recorded", c.Status, len(c.Events))
			}
			if !slices.Equal(names, want[:2]) || ps[1].Status.Code != codes.Error {
				t.Errorf("failed try's phases %v (last %v), want it to end in extract with an error", names, ps[len(ps)-1].Status)
			}
		default:
			t.Errorf("chunk outcome %v", attr(c.Attributes, "backfill.chunk.outcome").String())
		}
	}
	if failed != 1 {
		t.Errorf("%d failed chunk spans, want 1", failed)
	}
	var events []string
	for _, e := range run.Events {
		switch e.Name {
		case "backfill.retry":
			events = append(events, "retry "+attr(e.Attributes, "backfill.retry.kind").AsString()+" "+attr(e.Attributes, "db.response.status_code").AsString())
		case "backfill.throttle":
			events = append(events, "throttle "+attr(e.Attributes, "backfill.throttle.event").AsString()+" "+attr(e.Attributes, "backfill.throttle.signal").AsString())
		}
	}
	if !slices.Equal(events, []string{"retry wait 40001", "throttle hold level", "throttle release level"}) {
		t.Errorf("run span events %v", events)
	}

	// Metrics.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	rows := sums(t, rm, "backfill.rows", "backfill.outcome")
	if want := map[string]int64{"read": 501, "inserted": 500, "rejected": 1}; !mapsEqual(rows, want) {
		t.Errorf("backfill.rows = %v, want %v", rows, want)
	}
	if got := sums(t, rm, "backfill.exceptions", ""); got[""] != 1 {
		t.Errorf("backfill.exceptions = %v, want 1", got)
	}
	if got := sums(t, rm, "backfill.retries", "db.response.status_code"); !mapsEqual(got, map[string]int64{"40001": 1}) {
		t.Errorf("backfill.retries = %v, want one 40001", got)
	}
	if got := sums(t, rm, "backfill.chunks", "backfill.chunk.outcome"); !mapsEqual(got, map[string]int64{"done": 5, "failed": 1}) {
		t.Errorf("backfill.chunks = %v", got)
	}
	var hcount uint64
	var throttled float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				if m.Name == "backfill.chunk.duration" {
					for _, p := range d.DataPoints {
						hcount += p.Count
					}
				}
			case metricdata.Sum[float64]:
				if m.Name == "backfill.throttle.duration" {
					for _, p := range d.DataPoints {
						if v, _ := p.Attributes.Value("backfill.throttle.signal"); v.AsString() == "level" {
							throttled += p.Value
						}
					}
				}
			}
		}
	}
	if hcount != 6 {
		t.Errorf("backfill.chunk.duration has %d observations, want 6", hcount)
	}
	if throttled <= 0 {
		t.Errorf("backfill.throttle.duration{signal=level} = %v, want > 0", throttled)
	}
}

// holdOnce is the adapter, lowering the signal once it held.
type holdOnce struct {
	*backfillotel.Tracer
	sig  *level
	held *atomic.Bool
}

func (h holdOnce) TraceThrottle(ctx context.Context, d backfilltrace.ThrottleData) {
	h.Tracer.TraceThrottle(ctx, d)
	if d.Event == backfilltrace.ThrottleHold {
		h.sig.v.Store(0)
		h.held.Store(true)
	}
}

func attr(kvs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// sums returns the int64 sum name by the value of attribute by ("" for
// all).
func sums(t *testing.T, rm metricdata.ResourceMetrics, name, by string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			d, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is a %T", name, m.Data)
			}
			for _, p := range d.DataPoints {
				k := ""
				if by != "" {
					v, _ := p.Attributes.Value(attribute.Key(by))
					k = v.String()
				}
				out[k] += p.Value
			}
		}
	}
	return out
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
