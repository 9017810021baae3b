package backfill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfillthrottle"
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
		ReturnOnPause:    true, // the first call ends on the critical throttle's pause
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
	cd := v["chunk_durations"].(map[string]any)
	n := 0.0
	for _, b := range cd["bins"].([]any) {
		n += b.(map[string]any)["count"].(float64)
	}
	cd["bins"] = map[string]any{"count_sum": n}
	// The slowest chunks: which ones depends on the clock.
	for _, c := range v["notable_chunks"].([]any) {
		c := c.(map[string]any)
		var why []any
		for _, w := range c["notable"].([]any) {
			if w != "slowest" {
				why = append(why, w)
			}
		}
		c["notable"] = why
	}
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
// add up: the buckets hold every chunk and every row, the histogram
// every timed chunk, the time split its total.
func TestRunReportGolden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, batch := reportFixtureRun(t)
	rep, err := LoadRunReport(ctx, db, NewPGManifest(""), batch)
	require.NoError(t, err)

	requireReportAddsUp(t, rep)
	require.Equal(t, 4, rep.Durations.Count)
	require.Len(t, rep.Notable, 4, "4 chunks, all among the slowest")
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

// requireReportAddsUp checks that the buckets of rep hold every chunk
// and every row of its totals, the worker sums too, and the histogram
// every timed chunk.
func requireReportAddsUp(t *testing.T, rep RunReport) {
	t.Helper()
	require.LessOrEqual(t, len(rep.Buckets.Buckets), backfilltype.ReportMaxBuckets)
	chunks, byStatus, attempts, timed := 0, map[string]int{}, 0, 0
	var rows, wrows Counts
	busy := 0.0
	prev := -1
	for _, b := range rep.Buckets.Buckets {
		require.Greater(t, b.FirstSeq, prev, "buckets in plan order")
		require.LessOrEqual(t, b.LastSeq-b.FirstSeq+1, rep.Buckets.ChunksPerBucket)
		require.LessOrEqual(t, b.Chunks, b.LastSeq-b.FirstSeq+1)
		prev = b.LastSeq
		chunks += b.Chunks
		for s, n := range b.ChunksByStatus {
			byStatus[s] += n
		}
		attempts += b.Attempts
		timed += b.TimedChunks
		busy += b.BusySeconds
		rows = addReportCounts(rows, b.Rows)
	}
	total := 0
	for _, n := range rep.Totals.ChunksByStatus {
		total += n
	}
	require.Equal(t, rep.Plan.ChunksTotal, total)
	require.Equal(t, total, chunks, "every chunk in a bucket")
	require.Equal(t, rep.Totals.ChunksByStatus, byStatus)
	require.Equal(t, rep.Totals.Rows, rows, "every chunk's rows in the buckets")
	require.Equal(t, rep.Totals.Attempts, attempts)
	require.Equal(t, rep.Totals.TimedChunks, timed)
	require.InDelta(t, rep.Totals.BusySeconds, busy, 1e-6)
	wchunks := 0
	for _, w := range rep.ChunkWorkers {
		wchunks += w.Chunks
		wrows = addReportCounts(wrows, w.Rows)
	}
	require.Equal(t, total, wchunks)
	require.Equal(t, rep.Totals.Rows, wrows)
	n := 0
	for _, b := range rep.Durations.Bins {
		n += b.Count
	}
	require.Equal(t, rep.Totals.TimedChunks, n, "the histogram holds every timed chunk")
	require.Equal(t, rep.Durations.Count, n)
}

func addReportCounts(a, b Counts) Counts {
	return Counts{Read: a.Read + b.Read, Inserted: a.Inserted + b.Inserted, Updated: a.Updated + b.Updated,
		Unchanged: a.Unchanged + b.Unchanged, Rejected: a.Rejected + b.Rejected, Deduplicated: a.Deduplicated + b.Deduplicated}
}

// requireReportIsTheStatus checks that the report's totals are the
// run's status counts.
func requireReportIsTheStatus(t *testing.T, rep RunReport, st Status) {
	t.Helper()
	c := st.Chunks
	want := map[string]int{"done": c.Done, "open": c.Open, "pending": c.Pending, "failed": c.Failed, "staged": c.Staged, "rolled_back": c.RolledBack}
	for k, n := range want {
		if n == 0 {
			delete(want, k)
		}
	}
	require.Equal(t, want, rep.Totals.ChunksByStatus)
	require.Equal(t, c.Skipped, rep.Totals.ChunksSkipped)
	require.Equal(t, st.Rows, rep.Totals.Rows)
}

// TestRunReportManyChunks: a run of more chunks than the buckets' cap
// reports every chunk and every row in at most ReportMaxBuckets buckets,
// whose sums are the run's status and a count of its chunks; its
// notable chunks are the slowest, the failed, those with the most
// rejects and those in flight; the durations' percentiles are within a
// bin of the exact ones.
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
	// Durations of 0.1 s to 1.0999 s by seq; chunk 1234 is the slowest.
	db.MustExec(`UPDATE backfill.chunks SET status = 'done', attempts = 1, worker = 'w' || (seq % 3),
		started_at = now() - make_interval(secs => 10000 - seq),
		finished_at = now() - make_interval(secs => 10000 - seq) + make_interval(secs => CASE WHEN seq = 1234 THEN 30 ELSE 0.1 + seq / 10000.0 END),
		rows_read = seq, rows_inserted = seq - x.rej, rows_rejected = x.rej, checkpointed_at = now()
		FROM (SELECT CASE WHEN seq % 1000 = 500 THEN seq / 1000 + 1 ELSE 0 END AS rej, seq AS s FROM backfill.chunks) x
		WHERE batch_id = $1 AND x.s = seq`, run.BatchID)
	// Later statements move chunks between groups: the rollup follows.
	db.MustExec(`UPDATE backfill.chunks SET status = 'failed', attempts = 3, last_error = 'boom', checkpointed_at = NULL
		WHERE batch_id = $1 AND seq % 1000 = 7`, run.BatchID)
	db.MustExec(`UPDATE backfill.chunks SET status = 'pending', worker = '', started_at = NULL, finished_at = NULL,
		rows_read = 0, rows_inserted = 0, rows_rejected = 0, checkpointed_at = NULL WHERE batch_id = $1 AND seq >= 9990`, run.BatchID)
	db.MustExec(`UPDATE backfill.chunks SET rows_read = 1000, rows_inserted = 0, rows_rejected = 1000 WHERE batch_id = $1 AND seq = 42`, run.BatchID)
	rep, err := LoadRunReport(ctx, db, m, run.BatchID)
	require.NoError(t, err)
	requireReportAddsUp(t, rep)
	r, err := New(db, &Config{WorkerID: "reader"})
	require.NoError(t, err)
	st, err := r.StatusOf(ctx, run.BatchID)
	require.NoError(t, err)
	requireReportIsTheStatus(t, rep, st)
	require.Equal(t, map[string]int{"done": n - 10 - 10, "failed": 10, "pending": 10}, rep.Totals.ChunksByStatus)
	require.Equal(t, 32, rep.Buckets.ChunksPerBucket, "the smallest power of two for at most 512 buckets")
	require.Len(t, rep.Buckets.Buckets, 313)
	require.Equal(t, 3, rep.Totals.Workers)
	var attempts, timed int
	require.NoError(t, db.QueryRow(`SELECT sum(attempts), count(*) FILTER (WHERE started_at IS NOT NULL AND finished_at IS NOT NULL)
		FROM backfill.chunks WHERE batch_id = $1`, run.BatchID).Scan(&attempts, &timed))
	require.Equal(t, [2]int{attempts, timed}, [2]int{rep.Totals.Attempts, rep.Totals.TimedChunks})
	// The buckets are a count of the chunks.
	var want []struct {
		First int   `db:"first"`
		N     int   `db:"n"`
		Read  int64 `db:"read"`
	}
	require.NoError(t, db.Select(&want, `SELECT seq / 32 * 32 AS first, count(*) AS n,
		coalesce(sum(rows_read) FILTER (WHERE status IN ('done', 'open')), 0) AS read
		FROM backfill.chunks WHERE batch_id = $1 GROUP BY 1 ORDER BY 1`, run.BatchID))
	require.Len(t, rep.Buckets.Buckets, len(want))
	for i, w := range want {
		b := rep.Buckets.Buckets[i]
		require.Equal(t, [3]int64{int64(w.First), int64(w.N), w.Read}, [3]int64{int64(b.FirstSeq), int64(b.Chunks), b.Rows.Read}, "bucket %d", i)
	}
	// The durations: exact Min, Max, Mean; percentiles within a bin.
	d := rep.Durations
	require.Equal(t, n-10, d.Count)
	require.InDelta(t, 0.1, d.Min, 1e-9)
	require.InDelta(t, 30, d.Max, 1e-9)
	require.InDelta(t, 0.6, d.P50, 0.6*0.19+1e-3)
	require.GreaterOrEqual(t, d.P50, 0.6)
	require.GreaterOrEqual(t, d.P99, 1.08)
	require.LessOrEqual(t, d.P99, 1.1*1.19)
	for _, b := range d.Bins {
		require.Less(t, b.From, b.To)
	}
	// Notable chunks.
	why := map[int][]string{}
	for i, c := range rep.Notable {
		why[c.Seq] = c.Notable
		if i > 0 {
			require.Less(t, rep.Notable[i-1].Seq, c.Seq, "in plan order")
		}
	}
	require.Contains(t, why[1234], "slowest")
	require.Equal(t, []string{"most_rejects"}, why[42])
	require.Equal(t, []string{"failed"}, why[7])
	require.Equal(t, []string{"failed"}, why[9007])
	require.Equal(t, []string{"most_rejects"}, why[1500])
	require.Nil(t, why[500], "the fewest rejects")
	require.Len(t, rep.Notable, 10+10+10) // the slowest, the most rejects, the failed; none in flight
	// The audit trail: the first and the last events of a long one.
	require.False(t, rep.EventsOmitted)
	db.MustExec(`INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail)
		SELECT $1, 'many', 'chunk_retried', 'test', jsonb_build_object('n', g) FROM generate_series(1, 1000) g`, run.BatchID)
	rep, err = LoadRunReport(ctx, db, m, run.BatchID)
	require.NoError(t, err)
	require.True(t, rep.EventsOmitted)
	require.Len(t, rep.Events, backfilltype.ReportMaxEvents)
	var ids []int64
	require.NoError(t, db.Select(&ids, `SELECT id FROM backfill.events WHERE batch_id = $1 ORDER BY id`, run.BatchID))
	require.Equal(t, rep.Events[0].ID, ids[0])
	require.Equal(t, rep.Events[backfilltype.ReportMaxEvents/2-1].ID, ids[backfilltype.ReportMaxEvents/2-1])
	require.Equal(t, rep.Events[backfilltype.ReportMaxEvents/2].ID, ids[len(ids)-backfilltype.ReportMaxEvents/2])
	require.Equal(t, rep.Events[backfilltype.ReportMaxEvents-1].ID, ids[len(ids)-1])
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(rep))
	require.Less(t, buf.Len(), 1<<20, "a bounded report")
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
