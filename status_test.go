package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/pgbackfill/backfill/internal/testwait"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// progressRecorder is a ProgressHooks that keeps every call.
type progressRecorder struct {
	mu       sync.Mutex
	done     int
	failures []ChunkFailure
	progress []Status
}

func (p *progressRecorder) ChunkDone(context.Context, int64, ChunkResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
}

func (p *progressRecorder) ChunkFailed(_ context.Context, _ int64, f ChunkFailure) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures = append(p.failures, f)
}

func (p *progressRecorder) Progress(_ context.Context, s Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.progress = append(p.progress, s)
}

// TestStatusAndProgressAfterResume: a run whose first call fails a
// chunk for good is resumed by a second call; Runner.Status (and the
// first Progress of the second call) count the first call's chunks and
// rows, the failures reach ChunkFailed, and the exception queue is
// counted by reason and column.
func TestStatusAndProgressAfterResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	var failing sync.Map // seq -> true while the chunk fails
	failing.Store(4, true)
	job := liveJob(nil)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		if _, ok := failing.Load(c.Seq); ok {
			return fmt.Errorf("source of chunk %d is down", c.Seq)
		}
		if c.Seq == 0 {
			// One bad row, to the exception queue.
			if err := w.Reject(ctx, "bad", "v", "not a value"); err != nil {
				return err
			}
		}
		return inner.Extract(ctx, c, w)
	})
	rec1 := &progressRecorder{}
	r1, err := New(db, &Config{WorkerID: "w1", MaxAttempts: 1, Hooks: rec1})
	require.NoError(t, err)
	_, err = r1.Run(ctx, job)
	require.Error(t, err)
	require.Len(t, rec1.failures, 1)
	require.True(t, rec1.failures[0].Final)
	require.Equal(t, 4, rec1.failures[0].Chunk.Seq)

	st, err := r1.Status(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunFailed, st.Status)
	require.Equal(t, liveChunks, st.Chunks.Total)
	// A final failure stops the call: chunk 5 was never claimed.
	require.Equal(t, liveChunks-2, st.Chunks.Done)
	require.Equal(t, 1, st.Chunks.Failed)
	require.Equal(t, 1, st.Chunks.Pending)
	require.Equal(t, 2, st.RemainingChunks)
	require.Equal(t, int64(10*(liveChunks-2)+1), st.Rows.Read)
	require.Equal(t, int64(10*(liveChunks-2)), st.Rows.Inserted)
	require.Equal(t, int64(1), st.Rows.Rejected)
	require.Equal(t, st.Rows.Read, st.RowsProcessed)
	require.Equal(t, []backfilltype.ExceptionCount{{Reason: "not a value", Column: "v", Count: 1}}, st.Exceptions)
	require.NotNil(t, st.RemainingRows)
	// Int chunks of 10 keys each, 41 rows read over 40 keys.
	require.InDelta(t, 2*10*41.0/40, *st.RemainingRows, 1e-9)
	require.Nil(t, st.ETASeconds, "a failed run has no ETA")
	require.Contains(t, st.Waiting, "failed")
	require.Contains(t, st.String(), "no ETA: failed")
	require.True(t, st.Chunks.Done+st.Chunks.Failed+st.Chunks.Pending+st.Chunks.Open == st.Chunks.Total)

	// The status is the manifest's: another process, without the job's
	// code, reads the same.
	pm := NewPGManifest("")
	other, err := pm.JobStatus(ctx, db, job.Name)
	require.NoError(t, err)
	require.Equal(t, st.Chunks, other.Chunks)
	require.Equal(t, st.Rows, other.Rows)

	failing.Delete(4)
	rec2 := &progressRecorder{}
	r2, err := New(db, &Config{WorkerID: "w2", Hooks: rec2})
	require.NoError(t, err)
	rep, err := r2.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, 2, rec2.done)
	require.GreaterOrEqual(t, len(rec2.progress), 2)
	first, last := rec2.progress[0], rec2.progress[len(rec2.progress)-1]
	require.Equal(t, liveChunks-2, first.Chunks.Done, "the first progress of a resumed run counts the earlier call's chunks")
	require.Equal(t, int64(10*(liveChunks-2)+1), first.Rows.Read)
	require.Equal(t, liveChunks, last.Chunks.Done)
	require.Equal(t, RunCompleted, last.Status)
	require.Equal(t, int64(10*liveChunks+1), last.Rows.Read)
	require.Equal(t, 0.0, *last.ETASeconds)
	for i := 1; i < len(rec2.progress); i++ {
		require.GreaterOrEqual(t, rec2.progress[i].Chunks.Done, rec2.progress[i-1].Chunks.Done)
		require.GreaterOrEqual(t, rec2.progress[i].RowsProcessed, rec2.progress[i-1].RowsProcessed)
	}
	// JSON-friendly, and a String for people.
	b, err := json.Marshal(last)
	require.NoError(t, err)
	require.Contains(t, string(b), `"eta_seconds":0`)
	require.Contains(t, last.String(), fmt.Sprintf("chunks %d/%d done", liveChunks, liveChunks))

	_, err = pm.Status(ctx, db, 999999)
	require.ErrorIs(t, err, ErrRunNotFound)
}

// TestStatusTimeSplitAndETA: the time split and the ETA of a run whose
// history is written into the manifest at known times: 100 s old, a
// worker alive throughout, a throttle held from -80 s to -50 s, a pause
// from -40 s to -30 s, and 4 of 10 time chunks of one hour each
// checkpointed with 100 rows each. Working time is 60 s, the rate 400 /
// 60 rows/s (the recent window reaches the run's start: fewer than 21
// checkpoints), 600 rows remain: the ETA is 90 s.
func TestStatusTimeSplitAndETA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	require.NoError(t, pm.Init(ctx, db))
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	ch := Hours(start, start.Add(10*time.Hour), time.UTC)
	chunks, err := ch.Chunks(ctx)
	require.NoError(t, err)
	job := Job{Name: "split", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	plan := NewPlan(job, TableInfo{Target: job.Target}, chunks)
	run, _, err := pm.StartRun(ctx, db, plan, "w", false)
	require.NoError(t, err)
	b := run.BatchID
	// One transaction: now() is its start for every statement and every
	// Status, so the seconds the test states hold however slow the
	// machine.
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := tx.Exec(q, args...)
		require.NoError(t, err)
	}
	// The run started half a second before its first chunk's checkpoint
	// (0.5 s more of everything: within the deltas below).
	exec(`UPDATE backfill.runs SET created_at = now() - interval '100.5 s' WHERE batch_id = $1`, b)
	exec(`INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, stale_after, started_at, heartbeat_at)
		VALUES ('k', 'w', $1, 'split', interval '30 s', (SELECT created_at FROM backfill.runs WHERE batch_id = $1), now())`, b)
	exec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, value, high, low, started_at, ended_at)
		VALUES ($1, 'k', 'sql', 1, 1, 0, now() - interval '80 s', now() - interval '50 s')`, b)
	exec(`INSERT INTO backfill.events (batch_id, job_name, kind, created_at) VALUES ($1, 'split', 'run_paused', now() - interval '40 s'),
		($1, 'split', 'run_resumed_by_operator', now() - interval '30 s')`, b)
	exec(`UPDATE backfill.chunks SET status = 'done', rows_read = 100, rows_inserted = 100, rows_processed = 100, reads = 1,
		checkpointed_at = now() - (100 - 20 * seq) * interval '1 s' WHERE batch_id = $1 AND seq < 4`, b)

	st, err := pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 100, st.Time.TotalSeconds, 1)
	require.InDelta(t, 30, st.Time.ThrottledSeconds, 0.01)
	require.InDelta(t, 10, st.Time.PausedSeconds, 0.01)
	require.InDelta(t, 0, st.Time.IdleSeconds, 0.01)
	require.InDelta(t, 60, st.Time.WorkingSeconds, 1)
	require.InDelta(t, 0.3, st.Time.ThrottledFraction, 0.01)
	require.NotNil(t, st.RecentRate)
	require.InDelta(t, 400.0/60, *st.RecentRate, 0.15)
	require.InDelta(t, 400.0/60, *st.OverallRate, 0.15)
	require.InDelta(t, 4.0, *st.WallRate, 0.1)
	require.InDelta(t, 600, *st.RemainingRows, 1e-9)
	require.Equal(t, 6, st.RemainingChunks)
	require.InDelta(t, 90, *st.ETASeconds, 2)
	require.Empty(t, st.Waiting)
	require.Contains(t, st.String(), "(the recent working rate)")

	// The knobs in force now set the ETA's rate. Each chunk ran from the
	// run's start: 0 + 20 + 40 + 60 busy seconds over 60 working seconds
	// of the window, 2 chunks at once; the concurrency knob allows 1 (one
	// live worker): half the rate, twice the time.
	exec(`UPDATE backfill.chunks SET started_at = now() - interval '100 s' WHERE batch_id = $1 AND seq < 4`, b)
	exec(`SELECT backfill.set_knob($1::bigint, 'concurrency', '1', 'ann', 'quieter')`, b)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 180, *st.ETASeconds, 5)
	require.Contains(t, st.ETABasis, "concurrency")
	// rows_per_second 2 is slower still: 600 rows at 2 rows/s.
	exec(`SELECT backfill.set_knob($1::bigint, 'rows_per_second', '2', 'ann', 'quieter')`, b)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 300, *st.ETASeconds, 1e-6)
	require.InDelta(t, 2, *st.ETARate, 1e-9)
	require.Contains(t, st.String(), "ETA 5m0s at 2 rows/s (the rows_per_second knob (2))")

	// A wait paced by the rate cap is that rate, not a hold: the ETA stays.
	exec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, reason, value, high, low, started_at)
		VALUES ($1, 'k', $2, 'rate cap', 2, 2, 2, now() - interval '1 s')`, b, RateSignalName)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.NotNil(t, st.ETASeconds)
	require.Empty(t, st.Waiting)
	exec(`DELETE FROM backfill.throttle_periods WHERE signal = $1`, RateSignalName)

	// A throttle that holds every live worker now: no ETA, held by it.
	exec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, reason, value, high, low, started_at)
		VALUES ($1, 'k', 'replica_lag', 'lag 9 s at or above 5 s', 9, 5, 1, now() - interval '1 s')`, b)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.Nil(t, st.ETASeconds)
	require.Contains(t, st.Waiting, "held by throttle replica_lag (lag 9 s at or above 5 s)")
	exec(`DELETE FROM backfill.throttle_periods WHERE signal = 'replica_lag'`)

	// The worker died 20 s ago: its last 20 s are idle, not working, and
	// nothing works the run: no ETA, but what it waits for.
	exec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '20 s', stale_after = interval '5 s'`)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 20, st.Time.IdleSeconds, 1)
	require.InDelta(t, 40, st.Time.WorkingSeconds, 1)
	require.Equal(t, LivenessDead, st.Liveness)
	require.Nil(t, st.ETASeconds)
	require.Contains(t, st.Waiting, "no live worker")
	require.Contains(t, st.String(), "no ETA: no live worker")

	// Paused: no ETA, by whom and why, and how to resume it.
	exec(`SELECT backfill.pause($1::bigint, 'ann', 'replica lag')`, b)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.Nil(t, st.ETASeconds)
	require.Contains(t, st.Waiting, "paused by ann: replica lag since ")
	require.Contains(t, st.Waiting, fmt.Sprintf("SELECT backfill.resume(%d, 'ACTOR', 'WHY') or backfill resume --batch %d", b, b))
	exec(`SELECT backfill.cancel($1::bigint, 'ann', 'wrong scope')`, b)
	st, err = pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.Nil(t, st.ETASeconds)
	require.Contains(t, st.Waiting, "cancelled by ann: wrong scope")
}

// TestStatusInFlight: a chunk held by a worker is listed in flight with
// its worker and age while it is extracted.
func TestStatusInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	r := liveRunner(t, db, "holder", nil)
	// Serially: extracting ahead, chunk 2's transaction may still hold
	// its lease while chunk 3 is extracted, so one or two chunks are in
	// flight as the timing falls.
	r.cfg.SerialExtract = true
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 3 {
			close(inFlight)
			<-release
		}
	}))
	select {
	case <-inFlight:
	case res := <-done:
		t.Fatalf("the run ended before chunk 3 was in flight: %v", res.err)
	}
	st, err := r.Status(ctx, liveJob(nil))
	require.NoError(t, err)
	require.Len(t, st.InFlight, 1)
	f := st.InFlight[0]
	require.Equal(t, 3, f.Seq)
	require.Equal(t, "holder", f.WorkerID)
	require.NotEmpty(t, f.Host)
	require.GreaterOrEqual(t, f.AgeSeconds, 0.0)
	require.Equal(t, 1, st.Chunks.InFlight)
	require.Equal(t, LivenessRunning, st.Liveness)
	once.Do(func() { close(release) })
	res := <-done
	require.NoError(t, res.err)
	st, err = r.Status(ctx, liveJob(nil))
	require.NoError(t, err)
	require.Empty(t, st.InFlight)
	require.Equal(t, liveChunks, st.Chunks.Done)
}

// TestStatusStringShowsControlCharacters: text from the data (a job
// name, an exception's reason, a worker's host) in Status.String keeps
// to its line and carries no terminal escape.
func TestStatusStringShowsControlCharacters(t *testing.T) {
	t.Parallel()
	s := Status{Job: "jobs\x1b[2J", Exceptions: []backfilltype.ExceptionCount{{Reason: "bad\nvalue\x07", Column: "c\r", Count: 2}},
		InFlight: []backfilltype.ChunkInFlight{{ChunkID: "2024-01-01", WorkerID: "w\x1b]0;x\x07", Host: "h"}}}
	out := s.String()
	require.NotContains(t, out, "\x1b")
	require.NotContains(t, out, "\x07")
	require.NotContains(t, out, "\r")
	require.Contains(t, out, `jobs\x1b[2J`)
	require.Contains(t, out, `2 bad\x0avalue\x07 [c\x0d]`)
}

// BenchmarkStatus100k: PGManifest.Status of a run of 100,000 chunks, half
// of them checkpointed (over the last hour), with 10,000 exceptions of 5
// reasons and a worker. Reports only (ns/op).
//
//	go test -run '^$' -bench BenchmarkStatus100k -benchtime 20x .
func BenchmarkStatus100k(b *testing.B) {
	ctx := context.Background()
	db := pgtest.New(b)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		b.Fatal(err)
	}
	const n = 100_000
	ch := IntRange(0, 10*n, 10)
	chunks, err := ch.Chunks(ctx)
	if err != nil {
		b.Fatal(err)
	}
	job := Job{Name: "big", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE backfill.runs SET created_at = now() - interval '1 hour' WHERE batch_id = $1`,
		`UPDATE backfill.chunks SET status = 'done', rows_read = 10, rows_inserted = 10, rows_processed = 10, reads = 1,
			checkpointed_at = now() - (n_half - seq) * interval '72 ms' FROM (SELECT 50000 AS n_half) h WHERE batch_id = $1 AND seq < 50000`,
		`INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, stale_after, started_at)
			VALUES ('k', 'w', $1, 'big', interval '30 s', now() - interval '1 hour')`,
		`INSERT INTO backfill.exceptions (batch_id, chunk_id, row_number, column_name, reason)
			SELECT $1, 'int:' || (g * 10) || '/' || (g * 10 + 10), 1, 'c', 'reason ' || (g % 5) FROM generate_series(0, 9999) g`,
		`ANALYZE backfill.chunks`, `ANALYZE backfill.exceptions`,
	} {
		args := []any{run.BatchID}
		if q[:7] == "ANALYZE" {
			args = nil
		}
		if _, err := db.Exec(q, args...); err != nil {
			b.Fatal(err)
		}
	}
	if os.Getenv("STATUS_EXPLAIN") != "" {
		for _, q := range []string{`SELECT * FROM backfill.run_progress WHERE batch_id = $1`, `SELECT * FROM backfill.chunks_in_flight WHERE batch_id = $1`} {
			var plan []string
			if err := db.Select(&plan, `EXPLAIN (ANALYZE, COSTS OFF) `+q, run.BatchID); err != nil {
				b.Fatal(err)
			}
			b.Log(strings.Join(plan, "\n"))
		}
	}
	// The floor, for scale on a loaded machine: one pass over the run's
	// chunks (a count and a sum), as ms per op.
	begin := time.Now()
	for i := 0; i < 5; i++ {
		var n, sum int64
		if err := db.QueryRow(`SELECT count(*), sum(rows_read) FROM backfill.chunks WHERE batch_id = $1`, run.BatchID).Scan(&n, &sum); err != nil {
			b.Fatal(err)
		}
	}
	scan := float64(time.Since(begin).Microseconds()) / 5000
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := pm.Status(ctx, db, run.BatchID)
		if err != nil {
			b.Fatal(err)
		}
		if s.Chunks.Done != n/2 || s.ETASeconds == nil {
			b.Fatalf("status: %+v", s.Chunks)
		}
	}
	b.ReportMetric(scan, "scan-ms")
}

// TestStatusCountersNeverDecrease is a property test of the manifest's
// progress across any sequence of checkpoints (done, or open and read
// again), failed attempts (retried or final) and resumes (failed chunks
// pending again, open chunks claimable again): after every step, the
// checkpointed chunks, RowsProcessed and ChunkReads never decrease, the
// rows by outcome balance, and they never decrease either while no
// re-read of an open chunk found fewer rows than its earlier read (the
// one documented exception, Counts.Reread; the counts this step
// checkpointed only replace counts when it commits, so a rolled back
// step that would have shrunk them only makes the check stricter).
// Chunks by status always sum
// to the plan's total.
func TestStatusCountersNeverDecrease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	require.NoError(t, pm.Init(ctx, db))
	var jobs atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(rt, "chunks")
		ch := IntRange(0, int64(10*n), 10)
		chunks, err := ch.Chunks(ctx)
		require.NoError(rt, err)
		job := Job{Name: fmt.Sprintf("mono%d", jobs.Add(1)), Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
		plan := NewPlan(job, TableInfo{Target: job.Target}, chunks)
		run, _, err := pm.StartRun(ctx, db, plan, "w", false)
		require.NoError(rt, err)
		b := run.BatchID
		var prev Status
		shrunk := false
		steps := rapid.IntRange(1, 25).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch op := rapid.SampledFrom([]string{"complete", "complete", "fail", "resume"}).Draw(rt, "op"); op {
			case "complete":
				tx, err := db.Beginx()
				require.NoError(rt, err)
				st, ok, err := pm.ClaimChunk(ctx, tx, b)
				require.NoError(rt, err)
				if !ok {
					require.NoError(rt, tx.Rollback())
					continue
				}
				c := Counts{Inserted: rapid.Int64Range(0, 20).Draw(rt, "ins"), Updated: rapid.Int64Range(0, 20).Draw(rt, "upd"),
					Unchanged: rapid.Int64Range(0, 20).Draw(rt, "unch"), Rejected: rapid.Int64Range(0, 5).Draw(rt, "rej"),
					Deduplicated: rapid.Int64Range(0, 5).Draw(rt, "dedup")}
				c.Read = c.Inserted + c.Updated + c.Unchanged + c.Rejected + c.Deduplicated
				if st.Status == ChunkOpen {
					next := st.Counts.Reread(c)
					if next.Read < st.Read || next.Inserted < st.Inserted || next.Updated < st.Updated ||
						next.Unchanged < st.Unchanged || next.Rejected < st.Rejected || next.Deduplicated < st.Deduplicated {
						shrunk = true
					}
				}
				open := rapid.Bool().Draw(rt, "open")
				require.NoError(rt, pm.CompleteChunk(ctx, tx, b, ChunkResult{Chunk: st.Chunk, Counts: c, Worker: "w", Open: open}, nil))
				if rapid.Bool().Draw(rt, "commit") {
					require.NoError(rt, tx.Commit())
				} else {
					require.NoError(rt, tx.Rollback()) // a crash before the commit
				}
			case "fail":
				seq := rapid.IntRange(0, n-1).Draw(rt, "seq")
				require.NoError(rt, pm.FailChunk(ctx, db, b, seq, "boom", rapid.Bool().Draw(rt, "final")))
			case "resume":
				_, _, err := pm.StartRun(ctx, db, plan, "w", false)
				require.NoError(rt, err)
			}
			s, err := pm.Status(ctx, db, b)
			require.NoError(rt, err)
			c := s.Chunks
			require.Equal(rt, n, c.Total)
			require.Equal(rt, c.Total, c.Done+c.Open+c.Pending+c.Failed+c.Staged+c.RolledBack+c.Other)
			require.True(rt, s.Rows.Balanced(), "rows balance: %+v", s.Rows)
			require.GreaterOrEqual(rt, c.Done, prev.Chunks.Done, "chunks done")
			require.GreaterOrEqual(rt, c.Done+c.Open, prev.Chunks.Done+prev.Chunks.Open, "chunks checkpointed")
			require.GreaterOrEqual(rt, s.RowsProcessed, prev.RowsProcessed, "rows processed")
			require.GreaterOrEqual(rt, s.ChunkReads, prev.ChunkReads, "chunk reads")
			require.GreaterOrEqual(rt, s.RowsProcessed, s.Rows.Read)
			if !shrunk {
				for _, f := range []struct {
					name      string
					now, then int64
				}{{"read", s.Rows.Read, prev.Rows.Read}, {"inserted", s.Rows.Inserted, prev.Rows.Inserted},
					{"updated", s.Rows.Updated, prev.Rows.Updated}, {"unchanged", s.Rows.Unchanged, prev.Rows.Unchanged},
					{"rejected", s.Rows.Rejected, prev.Rows.Rejected}, {"deduplicated", s.Rows.Deduplicated, prev.Rows.Deduplicated}} {
					require.GreaterOrEqual(rt, f.now, f.then, "rows %s", f.name)
				}
			}
			require.Equal(rt, c.Pending+c.Failed, s.RemainingChunks)
			prev = s
		}
	})
}

// TestStatusShowsLockWaits: a chunk's transaction that waits for a lock
// another session holds on the target is listed in Status.LockWaits with
// the session that blocks it (its pid and query), and in the status text;
// once the lock is released the run completes and nothing waits.
func TestStatusShowsLockWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "w", LockTimeout: time.Minute, SerialExtract: true})
	require.NoError(t, err)
	locker, err := db.Connx(ctx)
	require.NoError(t, err)
	defer locker.Close()
	var lockerPID int
	require.NoError(t, locker.GetContext(ctx, &lockerPID, `SELECT pg_backend_pid()`))
	locked := make(chan struct{})
	var once sync.Once
	done := goRun(ctx, r, liveJob(func(c Chunk) {
		if c.Seq == 1 {
			once.Do(func() {
				_, err := locker.ExecContext(ctx, `BEGIN; LOCK TABLE live IN ACCESS EXCLUSIVE MODE`)
				require.NoError(t, err)
				close(locked)
			})
		}
	}))
	<-locked
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT max(batch_id) FROM backfill.runs`))
	var st Status
	testwait.Until(t, "the chunk's transaction waits for the lock, in Status", func() bool {
		st, err = r.StatusOf(ctx, batch)
		require.NoError(t, err)
		return len(st.LockWaits) > 0
	})
	w := st.LockWaits[0]
	require.Equal(t, "w", w.WorkerID)
	require.Equal(t, lockerPID, w.BlockerPID)
	require.Contains(t, w.BlockerQuery, "LOCK TABLE live")
	require.Equal(t, "relation", w.WaitEvent)
	require.Contains(t, st.String(), fmt.Sprintf("blocked by backend %d", lockerPID))
	_, err = locker.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)
	res := testwait.Recv(t, "the run once the lock is released", done)
	require.NoError(t, res.err)
	st, err = r.StatusOf(ctx, batch)
	require.NoError(t, err)
	require.Empty(t, st.LockWaits)
}

// TestStatusTextRatesOfEndedRuns: a run that ended shows no recent rate,
// and a rolled-back run says its rates are its load's, not next to its
// withdrawn counts as if it were working.
func TestStatusTextRatesOfEndedRuns(t *testing.T) {
	t.Parallel()
	r := 5210.0
	for st, want := range map[RunStatus]string{
		RunRunning:    "rate 5210 rows/s recent, 5210 overall",
		RunPaused:     "rate 5210 rows/s recent, 5210 overall",
		RunCompleted:  "rate 5210 rows/s overall (per working second), 5210 wall",
		RunRolledBack: "rate of its load, before the rollback: 5210 rows/s overall",
	} {
		s := Status{Job: "j", BatchID: 1, Status: st, RecentRate: &r, OverallRate: &r, WallRate: &r}
		text := s.String()
		require.Contains(t, text, want, "%s", st)
		if st != RunRunning && st != RunPaused {
			require.NotContains(t, text, "recent", "%s", st)
		}
	}
}

// TestStatusETASinceKnobChange: a throttle's watermark set 10 s ago,
// within the recent window, after which one chunk of 100 rows was
// checkpointed: the ETA's rate is the rate since the change (100 rows in
// 10 s, throttle holds included), not the window's (400 rows in 60
// working seconds), and the status text says which.
func TestStatusETASinceKnobChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pm, tx, b, exec := hourRunInTx(t, "knob")
	exec(`UPDATE backfill.runs SET created_at = now() - interval '60 s' WHERE batch_id = $1`, b)
	exec(`INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, stale_after, started_at, heartbeat_at)
		VALUES ('k', 'w', $1, 'knob', interval '30 s', now() - interval '60 s', now())`, b)
	// As set_knob records it, 10 s ago.
	exec(`INSERT INTO backfill.knobs (batch_id, key, value, set_by, reason) VALUES ($1, 'throttle.lag.high', 5, 'ann', 'gentler')`, b)
	exec(`INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail, created_at) VALUES ($1, 'knob', 'knob_set', 'ann',
		'{"key": "throttle.lag.high", "value": 5}', now() - interval '10 s')`, b)
	exec(`UPDATE backfill.chunks SET status = 'done', rows_read = 100, rows_inserted = 100, rows_processed = 100, reads = 1,
		checkpointed_at = now() - (50 - 15 * seq) * interval '1 s' WHERE batch_id = $1 AND seq < 4`, b)

	st, err := pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 400.0/60, *st.RecentRate, 0.2)
	require.InDelta(t, 10, *st.ETARate, 0.1, "100 rows in the 10 s since the change")
	require.InDelta(t, 60, *st.ETASeconds, 1)
	require.Contains(t, st.String(), "the rate since knob throttle.lag.high was set at")
	require.Contains(t, st.ETABasis, "throttle holds included")
}

// TestStatusETAIncludesThrottleWaits: a run paced by a rate cap set in
// its Config (no knob: the manifest does not know the cap) waits between
// its chunks; those waits are throttle periods, which the working rate
// leaves out, so the ETA counts them: the rows over the window's working
// and throttled time, not over its working time alone.
func TestStatusETAIncludesThrottleWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pm, tx, b, exec := hourRunInTx(t, "paced")
	exec(`UPDATE backfill.runs SET created_at = now() - interval '60 s' WHERE batch_id = $1`, b)
	exec(`INSERT INTO backfill.workers (worker_key, worker_id, batch_id, job_name, stale_after, started_at, heartbeat_at)
		VALUES ('k', 'w', $1, 'paced', interval '30 s', now() - interval '60 s', now())`, b)
	exec(`UPDATE backfill.chunks SET status = 'done', rows_read = 100, rows_inserted = 100, rows_processed = 100, reads = 1,
		started_at = now() - (54 - 15 * seq) * interval '1 s', checkpointed_at = now() - (50 - 15 * seq) * interval '1 s' WHERE batch_id = $1 AND seq < 4`, b)
	// The cap's waits: 9 s after each of the first three chunks, 27 s of
	// the 60.
	for _, ago := range []int{45, 30, 15} {
		exec(`INSERT INTO backfill.throttle_periods (batch_id, worker_key, signal, reason, value, high, low, started_at, ended_at)
			VALUES ($1, 'k', 'rows_per_second', 'rows-per-second cap 7', 7, 7, 7, now() - $2 * interval '1 s', now() - ($2 - 9) * interval '1 s')`, b, ago)
	}
	st, err := pm.Status(ctx, tx, b)
	require.NoError(t, err)
	require.InDelta(t, 400.0/33, *st.RecentRate, 0.3, "the working rate: 400 rows over the 33 s not throttled")
	require.InDelta(t, 400.0/60, *st.ETARate, 0.2, "the ETA's rate counts the waits")
	require.Contains(t, st.ETABasis, "rate-cap waits included (45% of the window)")
	require.Contains(t, st.String(), "rate-cap waits included")
}

// hourRunInTx starts a run of job name (10 hourly chunks, into table t)
// in a new manifest and returns the manifest, a transaction to write its
// history in (now() is its start for every statement and every Status,
// so the seconds a test states hold however slow the machine), the
// run's batch and an exec that fails the test on an error. The
// transaction is rolled back at the end of the test.
func hourRunInTx(t *testing.T, name string) (*PGManifest, *sqlx.Tx, int64, func(q string, args ...any)) {
	t.Helper()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	require.NoError(t, pm.Init(ctx, db))
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	ch := Hours(start, start.Add(10*time.Hour), time.UTC)
	chunks, err := ch.Chunks(ctx)
	require.NoError(t, err)
	job := Job{Name: name, Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	require.NoError(t, err)
	tx, err := db.Beginx()
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := tx.Exec(q, args...)
		require.NoError(t, err)
	}
	return pm, tx, run.BatchID, exec
}
