package backfillprom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	backfillprom "github.com/pgbackfill/backfill/contrib/prometheus"
)

func TestMain(m *testing.M) { backfilltest.PostgresMain(m) }

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

var errBug = errors.New("extractor bug")

// TestCollectorOfARun: a run on PostgreSQL with the collector as its
// tracer; a wait (40001) on chunk 1, a rejected row in chunk 2, a final
// failure of chunk 4. The collector exports the chunks by status and the
// run from the manifest, and the rows by outcome, the retries by SQLSTATE,
// the exceptions and the chunk durations from the tracer; a second
// collector that traced nothing (another process) shows the same chunks.
func TestCollectorOfARun(t *testing.T) {
	ctx := context.Background()
	db := backfilltest.NewPostgres(t)
	m := backfill.NewPGManifest("")
	c := backfillprom.New(db, m, backfillprom.Options{})
	var tries sync.Map
	var inFlight string
	other := backfillprom.New(db, m, backfillprom.Options{Jobs: []string{"items"}})
	job := itemsJob(t, db, func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		v, _ := tries.LoadOrStore(ch.Seq, new(atomic.Int64))
		n := v.(*atomic.Int64).Add(1)
		switch {
		case ch.Seq == 1 && n == 1:
			return &pq.Error{Code: "40001", Message: "could not serialize access"}
		case ch.Seq == 2:
			if err := w.Reject(ctx, map[string]any{"id": "x"}, "id", "not a number"); err != nil {
				return err
			}
		case ch.Seq == 3:
			// Scraped while chunk 3 is in flight, from the other collector.
			n, err := testutil.GatherAndCount(registry(other), "backfill_chunks")
			if err != nil {
				return err
			}
			inFlight = fmt.Sprint(n, " ", gaugeOf(other, "backfill_chunks", "status", "leased"))
		case ch.Seq == 4:
			return errBug
		}
		return writeIDs(ctx, ch, w)
	})
	r, err := backfill.New(db, &backfill.Config{Tracer: c,
		LockRetries: []backfill.LockRetry{{Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(ctx, job)
	if !errors.Is(err, errBug) {
		t.Fatalf("run: %v, want the extractor's error", err)
	}
	// While chunk 3 was extracted: chunk 3 leased, chunk 4 pending; and,
	// extracting ahead (the default), chunk 2 may still be in its
	// transaction, leased too.
	if inFlight != "5 1" && inFlight != "5 2" {
		t.Errorf("in flight: %q series and leased chunks, want \"5 1\" or, with chunk 2 still written, \"5 2\" (every status has a series)", inFlight)
	}

	want := fmt.Sprintf(`
# HELP backfill_chunks Chunks of the latest run of the job, by status, from the manifest (leased: in flight).
# TYPE backfill_chunks gauge
backfill_chunks{job="items",status="done"} 4
backfill_chunks{job="items",status="failed"} 1
backfill_chunks{job="items",status="leased"} 0
backfill_chunks{job="items",status="open"} 0
backfill_chunks{job="items",status="pending"} 0
# HELP backfill_run_info The latest run of the job (batch_id) and its status, from the manifest; always 1.
# TYPE backfill_run_info gauge
backfill_run_info{batch_id="%d",job="items",status="failed"} 1
`, rep.BatchID)
	for _, col := range []prometheus.Collector{c, other} {
		if err := testutil.CollectAndCompare(col, strings.NewReader(want), "backfill_chunks", "backfill_run_info", "backfill_lag_seconds"); err != nil {
			t.Error(err)
		}
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP backfill_rows_total Rows of the chunks this process committed, by outcome.
# TYPE backfill_rows_total counter
backfill_rows_total{job="items",outcome="inserted"} 400
backfill_rows_total{job="items",outcome="read"} 401
backfill_rows_total{job="items",outcome="rejected"} 1
# HELP backfill_exceptions_total Rows this process's committed chunks sent to the exception queue.
# TYPE backfill_exceptions_total counter
backfill_exceptions_total{job="items"} 1
# HELP backfill_retries_total Failed tries (kind wait) and attempts (kind attempt) of this process's chunks, by SQLSTATE.
# TYPE backfill_retries_total counter
backfill_retries_total{final="false",job="items",kind="wait",sqlstate="40001"} 1
backfill_retries_total{final="true",job="items",kind="attempt",sqlstate=""} 1
`), "backfill_rows_total", "backfill_exceptions_total", "backfill_retries_total"); err != nil {
		t.Error(err)
	}
	// Six attempts: four done, the wait and the final failure.
	if got := histogramCount(t, c, "backfill_chunk_duration_seconds"); got != "done=4 failed=2" {
		t.Errorf("chunk duration observations: %s", got)
	}
	if n := testutil.CollectAndCount(other, "backfill_rows_total"); n != 0 {
		t.Errorf("a collector that traced nothing has %d row series", n)
	}
}

// TestLagOfARunningRun: a run left running (cancelled after two chunks)
// shows its lag, the time since its last chunk was done, by the server's
// clock.
func TestLagOfARunningRun(t *testing.T) {
	db := backfilltest.NewPostgres(t)
	m := backfill.NewPGManifest("")
	c := backfillprom.New(db, m, backfillprom.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job := itemsJob(t, db, func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		if ch.Seq == 2 {
			cancel()
			return ctx.Err()
		}
		return writeIDs(ctx, ch, w)
	})
	r, err := backfill.New(db, &backfill.Config{Tracer: c})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, job); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	if n := testutil.CollectAndCount(c, "backfill_lag_seconds"); n != 1 {
		t.Fatalf("%d lag series, want 1", n)
	}
	var last time.Time
	// The server's clock at the checkpoint (checkpointed_at), not the
	// worker's (finished_at).
	if err := db.Get(&last, `SELECT max(checkpointed_at) FROM backfill.chunks WHERE status = 'done'`); err != nil {
		t.Fatal(err)
	}
	since := func() float64 {
		var s float64
		if err := db.Get(&s, `SELECT extract(epoch FROM now() - $1::timestamptz)`, last); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The lag read between two readings of the time since the last chunk
	// was done lies between them.
	before := since()
	lag := gaugeOf(c, "backfill_lag_seconds", "job", "items")
	after := since()
	if lag < before || lag > after {
		t.Errorf("lag %v s, want within [%v, %v]", lag, before, after)
	}
	// Extracting ahead (the default), chunk 2 is extracted while chunk
	// 1's transaction runs, and the cancel may roll that back too: every
	// chunk not done is pending, the cancelled ones released.
	var pending int
	if err := db.Get(&pending, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'`); err != nil {
		t.Fatal(err)
	}
	if pending < 3 {
		t.Errorf("%d chunks not done, want at least 3 (chunk 2 cancelled, 3 and 4 never run)", pending)
	}
	if got := gaugeOf(c, "backfill_chunks", "status", "pending"); got != float64(pending) {
		t.Errorf("pending chunks %v, want %d (the cancelled ones released)", got, pending)
	}
}

func registry(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return reg
}

// gaugeOf returns the value of the series of name whose label is value
// (-1 when there is none).
func gaugeOf(c prometheus.Collector, name, label, value string) float64 {
	mfs, err := registry(c).Gather()
	if err != nil {
		return -2
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

func histogramCount(t *testing.T, c prometheus.Collector, name string) string {
	t.Helper()
	mfs, err := registry(c).Gather()
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" {
					out = lp.GetValue()
				}
			}
			parts = append(parts, fmt.Sprintf("%s=%d", out, m.GetHistogram().GetSampleCount()))
		}
	}
	return strings.Join(parts, " ")
}

// TestChunksSkipped: the chunks a replay with SkipUnchanged skipped,
// from the manifest (0 for the load, 5 for the replay).
func TestChunksSkipped(t *testing.T) {
	ctx := context.Background()
	db := backfilltest.NewPostgres(t)
	c := backfillprom.New(db, backfill.NewPGManifest(""), backfillprom.Options{})
	job := itemsJob(t, db, writeIDs)
	job.SkipUnchanged, job.NewRun, job.ChunkColumn = true, true, "id"
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0", "5"} {
		if _, err := r.Run(ctx, job); err != nil {
			t.Fatal(err)
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP backfill_chunks_skipped Done chunks of the latest run of the job whose staging and merge were skipped, their rows unchanged (SkipUnchanged), from the manifest.
# TYPE backfill_chunks_skipped gauge
backfill_chunks_skipped{job="items"} `+want+`
`), "backfill_chunks_skipped"); err != nil {
			t.Error(err)
		}
	}
}
