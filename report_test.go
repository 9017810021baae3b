package backfill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// reportFixtureRun runs a small deterministic job on a fresh database and
// returns the database and the batch: 4 chunks of 10 ids at concurrency
// 1 by worker "worker-a", rows rejected for two reasons, a warning check
// failing on one chunk, and a pause by a critical throttle before the
// first chunk that "oncall" resumes, and a hold of the same throttle
// after.
func reportFixtureRun(t *testing.T) (*sqlx.DB, int64) {
	t.Helper()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE pressure (v int NOT NULL); INSERT INTO pressure VALUES (150); CREATE SEQUENCE pressure_reads`)
	db.MustExec(`CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)`)
	r, err := New(db, &Config{
		WorkerID:         "worker-a",
		Concurrency:      1,
		ThrottleInterval: 50 * time.Millisecond,
		Throttles: []backfillthrottle.Throttle{
			// 150 (critical) until the operator lowers it to 0; then 90
			// (a hold) for two readings, then 10.
			{Signal: backfillthrottle.SQLSignal("pressure", `SELECT CASE WHEN v > 100 THEN v WHEN nextval('pressure_reads') <= 2 THEN 90 ELSE 10 END FROM pressure`),
				High: 80, Low: 50, Critical: 100},
		},
	})
	require.NoError(t, err)
	job := Job{
		Name:        "items",
		Source:      "fixture",
		CodeVersion: "v1.2.3",
		Chunker:     IntRange(0, 40, 10),
		Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				var err error
				switch {
				case id > 0 && id%7 == 0:
					err = w.Reject(ctx, map[string]any{"id": id, "v": -id}, "v", "negative value")
				case id > 0 && id%9 == 0:
					err = w.Reject(ctx, map[string]any{"line": fmt.Sprint("garbage ", id)}, "", "unparseable line")
				default:
					err = w.Write(ctx, id, id*10)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback:         RollbackNone,
		MaxRunRejectRate: 0.5,
		Target:           Target{Table: "items", Key: []string{"id"}},
		Validators: []Validator{
			CheckExceptionRate{MaxRate: 0.5},
			ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s ValidationScope) (CheckResult, error) {
				ok := s.Chunk.Lo != 20
				return CheckResult{Check: "no_twenties", Severity: SeverityWarn, Passed: ok, Expected: "no chunk 20",
					Actual: fmt.Sprint("chunk ", s.Chunk.Lo), Sample: []string{s.Chunk.ID}}, nil
			}),
		},
	}
	_, err = r.Run(ctx, job)
	require.True(t, errors.Is(err, ErrRunPaused), "first call pauses on the critical throttle: %v", err)
	db.MustExec(`UPDATE pressure SET v = 0`)
	rep, err := r.Resume(ctx, job, "oncall", "pressure is back to normal")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	return db, rep.BatchID
}

var (
	reportTimeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$`)
	reportHostRE = regexp.MustCompile(`^[^:]+:\d+$`)
)

// normaliseReport replaces what depends on the clock and the machine in
// the JSON form of a report: times become "T", positive durations and
// rates "+", the timing-dependent series their sums, ids 0.
func normaliseReport(t *testing.T, rep RunReport) []byte {
	t.Helper()
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(b, &v))
	tp := v["throughput"].(map[string]any)
	sum := 0.0
	for _, b := range tp["buckets"].([]any) {
		sum += b.(map[string]any)["rows"].(float64)
	}
	tp["buckets"] = map[string]any{"rows_sum": math.Round(sum)}
	cd := v["chunk_durations"].(map[string]any)
	n := 0.0
	for _, b := range cd["bins"].([]any) {
		n += b.(map[string]any)["count"].(float64)
	}
	cd["bins"] = map[string]any{"count_sum": n}
	for _, e := range v["events"].([]any) {
		e.(map[string]any)["id"] = 0 // identities may skip
	}
	// Holds of the rate cap: how many depends on the clock.
	tm := v["time"].(map[string]any)
	signals := map[string]bool{}
	for _, p := range tm["periods"].([]any) {
		signals[p.(map[string]any)["signal"].(string)] = true
	}
	tm["periods"] = signals
	for k, d := range tm["throttled_seconds"].(map[string]any) {
		if d.(float64) > 0 {
			tm["throttled_seconds"].(map[string]any)[k] = "+"
		}
	}
	tm["periods_total"] = len(signals) > 0
	for _, s := range tm["signals"].([]any) {
		s.(map[string]any)["holds"] = "+"
	}
	var walk func(key string, x any) any
	walk = func(key string, x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k, y := range x {
				x[k] = walk(k, y)
			}
		case []any:
			for i, y := range x {
				x[i] = walk(key, y)
			}
		case string:
			switch {
			case reportTimeRE.MatchString(x):
				return "T"
			case key == "worker_id" && reportHostRE.MatchString(x), key == "host":
				return "HOST"
			case key == "db_role": // the test server's role
				return "ROLE"
			}
		case float64:
			timed := key == "rows_per_second" || key == "bucket_seconds" || key == "held_seconds" ||
				key == "pid" || key == "waited" || key == "sleep" || len(key) > 8 && key[len(key)-8:] == "_seconds"
			if timed && x > 0 {
				return "+"
			}
		}
		return x
	}
	walk("", v)
	out, err := json.MarshalIndent(v, "", "  ")
	require.NoError(t, err)
	return append(out, '\n')
}

// TestRunReportGolden: the report of a deterministic run, with the clock
// and the machine normalised away, is testdata/run_report.golden.json
// (go test -run TestRunReportGolden -update rewrites it); and its series
// add up: the rows/s buckets hold every row read, the histogram every
// timed chunk, the time split its total.
func TestRunReportGolden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, batch := reportFixtureRun(t)
	rep, err := LoadRunReport(ctx, db, NewPGManifest(""), batch)
	require.NoError(t, err)

	sum := 0.0
	for _, b := range rep.Throughput.Buckets {
		sum += b.Rows
		require.InDelta(t, b.Rows/rep.Throughput.BucketSeconds, b.RowsPerSecond, 1e-6)
	}
	require.InDelta(t, float64(rep.Totals.Rows.Read), sum, 1e-6, "the rows/s buckets hold every row read")
	n := 0
	for _, b := range rep.Durations.Bins {
		n += b.Count
	}
	require.Equal(t, len(rep.Chunks), n, "the histogram holds every timed chunk")
	parts := rep.Time.WorkingSeconds + rep.Time.PausedSeconds + rep.Time.IdleSeconds
	for _, s := range rep.Time.ThrottledSeconds {
		parts += s
	}
	require.InDelta(t, rep.Time.TotalSeconds, parts, 1e-6)
	require.Positive(t, rep.Time.PausedSeconds, "the run was paused")
	require.Positive(t, rep.Time.ThrottledSeconds["pressure"], "the run was held")

	got := normaliseReport(t, rep)
	path := filepath.Join("testdata", "run_report.golden.json")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}

// TestRunReportMissingRun: a batch that does not exist is ErrRunNotFound.
func TestRunReportMissingRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	defer db.Close()
	m := NewPGManifest("")
	require.NoError(t, m.Init(ctx, db))
	_, err := LoadRunReport(ctx, db, m, 42)
	require.ErrorIs(t, err, ErrRunNotFound)
}

// TestReportThroughputSpreadsRows: each chunk's rows spread evenly over
// its start to finish; buckets cover the run; rates are rows per bucket
// second.
func TestReportThroughputSpreadsRows(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) *time.Time { x := t0.Add(time.Duration(s * float64(time.Second))); return &x }
	chunks := []backfilltype.ReportChunk{
		{StartedAt: at(0), FinishedAt: at(10), Counts: Counts{Read: 100}},
		{StartedAt: at(5), FinishedAt: at(5), Counts: Counts{Read: 7}}, // instantaneous
		{StartedAt: at(10), FinishedAt: at(20), Counts: Counts{Read: 50}},
		{Counts: Counts{Read: 1000}}, // never timed
	}
	tp := pgstore.BuildReportThroughput(chunks, 4) // 20 s in at most 4 buckets: 5 s each
	require.Equal(t, 5.0, tp.BucketSeconds)
	var rows []float64
	for _, b := range tp.Buckets {
		rows = append(rows, b.Rows)
	}
	require.Equal(t, []float64{50, 57, 25, 25, 0}, rows)
	require.Equal(t, 57.0/5, tp.Buckets[1].RowsPerSecond)
	require.Equal(t, t0, *tp.Start)
}

// TestReportDurationsHistogram: percentiles by nearest rank, and every
// timed chunk in exactly one bin, the greatest in the last.
func TestReportDurationsHistogram(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var chunks []backfilltype.ReportChunk
	for i := 1; i <= 100; i++ {
		end := t0.Add(time.Duration(i) * time.Second)
		chunks = append(chunks, backfilltype.ReportChunk{StartedAt: &t0, FinishedAt: &end, DurationSeconds: float64(i)})
	}
	chunks = append(chunks, backfilltype.ReportChunk{}) // pending: no duration
	d := pgstore.BuildReportDurations(chunks, 10)
	require.Equal(t, 100, d.Count)
	require.Equal(t, []float64{1, 50, 90, 99, 100, 50.5}, []float64{d.Min, d.P50, d.P90, d.P99, d.Max, d.Mean})
	require.Len(t, d.Bins, 10)
	counts := make([]int, len(d.Bins))
	for i, b := range d.Bins {
		counts[i] = b.Count
	}
	require.Equal(t, []int{10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, counts)
	require.Equal(t, 100.0, d.Bins[9].To)
	one := pgstore.BuildReportDurations(chunks[:1], 10)
	require.Equal(t, []backfilltype.ReportBin{{From: 1, To: 1, Count: 1}}, one.Bins)
}

// TestRunReportManyChunks: a run of 10,000 chunks reports every chunk,
// with the counts summed.
func TestRunReportManyChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	defer db.Close()
	m := NewPGManifest("")
	require.NoError(t, m.Init(ctx, db))
	const n = 10_000
	job := Job{Name: "many", Chunker: IntRange(0, n, 1)}
	chunks, err := job.Chunker.Chunks(ctx)
	require.NoError(t, err)
	plan := NewPlan(job, TableInfo{Target: Target{Table: "t", Key: []string{"id"}}}, chunks)
	run, _, err := m.StartRun(ctx, db, plan, "w", false)
	require.NoError(t, err)
	db.MustExec(`UPDATE backfill.chunks SET status = 'done', attempts = 1, worker = 'w' || (seq % 3),
		started_at = now() - make_interval(secs => 10000 - seq), finished_at = now() - make_interval(secs => 10000 - seq) + interval '0.5 s',
		rows_read = seq, rows_inserted = seq WHERE batch_id = $1`, run.BatchID)
	rep, err := LoadRunReport(ctx, db, m, run.BatchID)
	require.NoError(t, err)
	require.Len(t, rep.Chunks, n)
	require.Equal(t, int64(n*(n-1)/2), rep.Totals.Rows.Read)
	require.Equal(t, 3, rep.Totals.Workers)
	require.Equal(t, map[string]int{"done": n}, rep.Totals.ChunksByStatus)
	require.LessOrEqual(t, len(rep.Throughput.Buckets), pgstore.ReportRateBuckets+1)
	require.InDelta(t, 0.5, rep.Durations.P99, 1e-9)
	for i, c := range rep.Chunks {
		require.Equal(t, i, c.Seq, "chunks in plan order")
	}
	require.Equal(t, "many", rep.Plan.Job)
	require.Equal(t, "int", rep.Plan.ChunkKind)
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(rep))
}

// TestReportTimeSplitIsTheStatus: the report and the status split a run's
// time alike: a run whose first worker stopped (its run left running with
// no live worker, then paused and cancelled from SQL, then resumed and
// completed by another call) has idle time in both, not working time, and
// the same working, paused, throttled and idle seconds in both.
func TestReportTimeSplitIsTheStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r := liveRunner(t, db, "w1", nil)
	cctx, cancel := context.WithCancel(ctx)
	_, err := r.Run(cctx, liveJob(func(c Chunk) {
		if c.Seq == 1 {
			cancel()
		}
	}))
	require.ErrorIs(t, err, context.Canceled)
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
	// The worker finished: the time until the next event is idle.
	waitServerClock(t, db, 300*time.Millisecond)
	_, err = db.Exec(`SELECT backfill.pause($1::bigint, 'ann', 'look')`, batch)
	require.NoError(t, err)
	waitServerClock(t, db, 100*time.Millisecond)
	_, err = db.Exec(`SELECT backfill.cancel($1::bigint, 'ann', 'wrong')`, batch)
	require.NoError(t, err)
	waitServerClock(t, db, 300*time.Millisecond)
	_, err = r.Resume(ctx, liveJob(nil), "ann", "fine")
	require.NoError(t, err)

	rep, err := LoadRunReport(ctx, db, NewPGManifest(""), batch)
	require.NoError(t, err)
	st, err := r.StatusOf(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, st.Status)
	split, err := r.TimeSplit(ctx, batch)
	require.NoError(t, err)
	const eps = 0.002 // seconds: the view's epoch arithmetic
	throttled := 0.0
	for _, s := range rep.Time.ThrottledSeconds {
		throttled += s
	}
	require.InDelta(t, st.Time.TotalSeconds, rep.Time.TotalSeconds, eps)
	require.InDelta(t, st.Time.WorkingSeconds, rep.Time.WorkingSeconds, eps)
	require.InDelta(t, st.Time.PausedSeconds, rep.Time.PausedSeconds, eps)
	require.InDelta(t, st.Time.IdleSeconds, rep.Time.IdleSeconds, eps)
	require.InDelta(t, st.Time.ThrottledSeconds, throttled, eps)
	require.InDelta(t, st.Time.IdleSeconds, split.Idle.Seconds(), eps)
	require.InDelta(t, st.Time.WorkingSeconds, split.Working.Seconds(), eps)
	require.GreaterOrEqual(t, rep.Time.IdleSeconds, 0.5, "the time with no worker (dead, then cancelled) is idle")
	require.GreaterOrEqual(t, rep.Time.PausedSeconds, 0.1)
}

// waitServerClock waits until d has passed on the server's clock.
func waitServerClock(t *testing.T, db *sqlx.DB, d time.Duration) {
	t.Helper()
	var start time.Time
	require.NoError(t, db.Get(&start, `SELECT clock_timestamp()`))
	for {
		var now time.Time
		require.NoError(t, db.Get(&now, `SELECT clock_timestamp()`))
		if now.Sub(start) >= d {
			return
		}
		time.Sleep(d / 10)
	}
}
