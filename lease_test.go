package backfill

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestNoTransactionWhileExtracting: while every extractor of a run
// (Concurrency 2) sleeps, no session of the library is in a transaction
// (pg_stat_activity.xact_start), heartbeats and the monitor's momentary
// reads aside (the run's control state and live workers, read every
// ThrottleInterval in a transaction of one statement): the chunk's
// transaction begins after its extraction (short transactions).
// It also logs the oldest transaction age of the
// library's sessions seen in any sample, against the extractor's sleep
// (BACKFILL_SHORTTX_SLEEP, e.g. 10s, to measure what a long extraction holds).
// The same holds with a job-wide concurrency cap (Config.JobConcurrency),
// which counts leases rather than holding a slot row lock.
func TestNoTransactionWhileExtracting(t *testing.T) {
	t.Parallel()
	for _, jc := range []int{0, 2} {
		t.Run(fmt.Sprint("job_concurrency_", jc), func(t *testing.T) {
			t.Parallel()
			testNoTransactionWhileExtracting(t, jc)
		})
	}
}

func testNoTransactionWhileExtracting(t *testing.T, jobConcurrency int) {
	ctx := context.Background()
	db := liveDB(t)
	sleep := 500 * time.Millisecond
	if s := os.Getenv("BACKFILL_SHORTTX_SLEEP"); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err)
		sleep = d
	}
	var sleeping, starts, asleepAt atomic.Int64
	job := liveJob(nil)
	job.Chunker = IntRange(0, 40, 10)
	inner := job.Extractor
	job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
		starts.Add(1)
		asleepAt.Store(time.Now().UnixNano()) // the latest extractor to fall asleep
		sleeping.Add(1)
		time.Sleep(sleep)
		sleeping.Add(-1)
		return inner.Extract(ctx, c, w)
	})
	r := liveRunner(t, db, "sleeper", nil)
	r.cfg.Concurrency = 2
	r.cfg.JobConcurrency = jobConcurrency
	r.cfg.HeartbeatInterval, r.cfg.StaleAfter = 10*time.Second, time.Minute
	// The property under test is that a worker holds no transaction while
	// its extractor runs. Extracting ahead, a slot's other goroutine
	// writes the previous chunk during the extraction, by design (the
	// transaction is the previous chunk's, never the one extracted), so
	// both extractors sleeping says nothing about open transactions there.
	r.cfg.SerialExtract = true

	poll, err := db.Connx(ctx)
	require.NoError(t, err)
	defer poll.Close()
	done := goRun(ctx, r, job)
	var res runResult
	samples, inTx := 0, 0
	var oldest time.Duration
	var seen []string
	for finished := false; !finished; {
		select {
		case res = <-done:
			finished = true
			continue
		case <-time.After(20 * time.Millisecond):
		}
		before, gen := sleeping.Load(), starts.Load()
		// Both have slept since at least this long before the sample: a
		// transaction a worker holds across its extraction began before
		// its sleep, so is older than that; a momentary read begun
		// meanwhile (caught at its COMMIT on a loaded machine) is not.
		bothAsleep := time.Since(time.Unix(0, asleepAt.Load()))
		var rows []struct {
			Query string  `db:"query"`
			Age   float64 `db:"age"`
		}
		require.NoError(t, poll.SelectContext(ctx, &rows, `SELECT query, extract(epoch FROM now() - xact_start)::float8 AS age FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
				AND xact_start IS NOT NULL AND query NOT LIKE '%heartbeat_at = now()%'
				AND query NOT LIKE '%.knobs k WHERE k.batch_id = r.batch_id%' AND query NOT LIKE 'SELECT worker_key FROM %.workers%'`))
		for _, row := range rows {
			oldest = max(oldest, time.Duration(row.Age*float64(time.Second)))
		}
		// The monitor's momentary reads (control state, live workers,
		// heartbeats) are set aside by their text above, and, caught at
		// their BEGIN, by their age: a transaction held across an
		// extractor's sleep is seen older than that by the next samples.
		rows = slices.DeleteFunc(rows, func(r struct {
			Query string  `db:"query"`
			Age   float64 `db:"age"`
		}) bool {
			return r.Age < 0.1 || r.Age < bothAsleep.Seconds()
		})
		if before == 2 && sleeping.Load() == 2 && starts.Load() == gen {
			// Both extractors slept through the sample.
			samples++
			if len(rows) > 0 {
				if inTx < 3 {
					seen = append(seen, fmt.Sprintf("%q (%.3fs)", rows[0].Query, rows[0].Age))
				}
				inTx++
			}
		}
	}
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, int64(40), res.rep.Counts.Inserted)
	require.Positive(t, samples, "no sample was taken while both extractors slept")
	require.Zero(t, inTx, "sessions of the library in a transaction while every extractor slept, e.g. %v", seen)
	t.Logf("extractor sleep %v per chunk: oldest xact_start age of the library's sessions in any sample: %v (%d samples while both slept)", sleep, oldest, samples)
}

// TestLostLeaseAfterServerCrash: the lease's commit does not wait for the
// WAL flush (leaseQuery, synchronous_commit off), so a server crash right
// after it can lose the lease, and the next lease of the chunk, by
// another worker, then takes the same lease_epoch number. The worker that
// lost its lease must not commit the chunk: its fence matches the key as
// well as the epoch. The server keeps its WAL unwritten for 10 s
// (wal_writer_delay) and nothing else commits between the lease and the
// crash (long heartbeats), so that the lease is really lost.
func TestLostLeaseAfterServerCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := pgtest.StartWith(ctx, pgtest.Options{SynchronousCommit: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Stop()) }()
	db, err := sqlx.Open("postgres", srv.URL())
	require.NoError(t, err)
	defer db.Close()
	db.MustExec(`ALTER SYSTEM SET wal_writer_delay = '10s'`)
	db.MustExec(`ALTER SYSTEM SET bgwriter_lru_maxpages = 0`)
	db.MustExec(`SELECT pg_reload_conf()`)
	db.MustExec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)

	cfg := func(id string, logs *syncBuffer) *Config {
		// Serial extraction: extracting ahead, chunk 1's commit (flushed,
		// synchronous_commit on) may follow chunk 2's lease and write it
		// to disk, so that the crash loses nothing.
		return &Config{WorkerID: id, HeartbeatInterval: 20 * time.Second, StaleAfter: time.Minute,
			RetryBackoff: 20 * time.Millisecond, SerialExtract: true,
			Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	}
	var logsA, logsB syncBuffer
	ra, err := New(db, cfg("a", &logsA))
	require.NoError(t, err)
	rb, err := New(db, cfg("b", &logsB))
	require.NoError(t, err)

	// A leases chunk 2 and holds in its extraction until released.
	aHolds, releaseA := make(chan struct{}), make(chan struct{})
	var aOnce sync.Once
	doneA := goRun(ctx, ra, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			aOnce.Do(func() { close(aHolds); <-releaseA })
		}
	}))
	<-aHolds
	type lease struct {
		Key   sql.NullString `db:"lease_key"`
		Epoch int64          `db:"lease_epoch"`
	}
	var before, after lease
	require.NoError(t, db.Get(&before, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.True(t, before.Key.Valid, "A's lease is visible once committed")

	require.NoError(t, srv.RestartImmediate(ctx, nil))
	require.Eventually(t, func() bool { return db.PingContext(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, db.Get(&after, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.False(t, after.Key.Valid, "A's lease was lost with the crash (its commit was not flushed)")
	require.Equal(t, before.Epoch-1, after.Epoch)

	// B leases chunk 2 at A's lost epoch, under its own key, and holds
	// until A's fence has failed.
	bHolds, releaseB := make(chan struct{}), make(chan struct{})
	var bOnce sync.Once
	doneB := goRun(ctx, rb, liveJob(func(c Chunk) {
		if c.Seq == 2 {
			bOnce.Do(func() { close(bHolds); <-releaseB })
		}
	}))
	<-bHolds
	var taken lease
	require.NoError(t, db.Get(&taken, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.Equal(t, before.Epoch, taken.Epoch, "B's lease reuses the lost epoch number")
	require.NotEqual(t, before.Key.String, taken.Key.String)

	close(releaseA)
	require.Eventually(t, func() bool { return strings.Contains(logsA.String(), "chunk's fence failed") }, 60*time.Second, 20*time.Millisecond,
		"A's fence fails on B's lease of the same epoch")
	close(releaseB)
	resB, resA := <-doneB, <-doneA
	require.NoError(t, resB.err)
	t.Logf("A's run: %v (%s)", resA.err, resA.rep.Status)

	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
	var chunks []struct {
		Seq      int    `db:"seq"`
		Status   string `db:"status"`
		Read     int64  `db:"rows_read"`
		Inserted int64  `db:"rows_inserted"`
	}
	require.NoError(t, db.Select(&chunks, `SELECT seq, status, rows_read, rows_inserted FROM backfill.chunks ORDER BY seq`))
	require.Len(t, chunks, liveChunks)
	for _, c := range chunks {
		require.Equal(t, "done", c.Status, "chunk %d", c.Seq)
		require.Equal(t, int64(10), c.Read, "chunk %d read once", c.Seq)
		require.Equal(t, int64(10), c.Inserted, "chunk %d inserted once", c.Seq)
	}
}

// TestPausedRunReleasesLeaseOfChunkInFlight: a run paused while a chunk
// is extracted (an operator's pause, a gate on another chunk): the
// chunk's fence fails, and its lease is released, so that a resume by a
// new process does the chunk at once.
func TestPausedRunReleasesLeaseOfChunkInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r1 := liveRunner(t, db, "w1", nil)
	r1.cfg.ReturnOnPause = true // the first process ends on the pause
	r1.cfg.StaleAfter, r1.cfg.HeartbeatInterval = 30*time.Second, time.Second
	_, _ = r1.Run(ctx, liveJob(func(c Chunk) {
		if c.Seq == 0 {
			var b int64
			require.NoError(t, db.Get(&b, `SELECT batch_id FROM backfill.runs WHERE job_name = 'live'`))
			require.NoError(t, r1.caps.validations.PauseRun(ctx, db, b, "operator pause"))
		}
	}))
	var key sql.NullString
	require.NoError(t, db.Get(&key, `SELECT lease_key FROM backfill.chunks WHERE seq = 0`))
	require.False(t, key.Valid, "the paused chunk's lease is released")

	r2 := liveRunner(t, db, "w2", nil)
	r2.cfg.StaleAfter, r2.cfg.HeartbeatInterval = 30*time.Second, time.Second
	rep, err := r2.Resume(ctx, liveJob(nil), "oncall", "resume after pause")
	require.NoError(t, err)
	require.Equal(t, RunCompleted, rep.Status)
	require.Equal(t, liveChunks, chunkStatuses(t, db)["done"])
}

// TestYoungLeaseOfDeadWorkerIsWaitedFor: a worker killed right after it
// leased a chunk (its heartbeat already past StaleAfter, its lease not
// yet): a new process must wait for that lease until it is stale, then
// take it over, not return with the chunk pending. On the commit before
// this fix the claim judged the lease live and the wait judged it dead:
// the resume returned nil, status running, a chunk pending.
//
// The lease is kept young (leased now) until the new process says it
// waits for it, then made stale: whatever the machine's load, the new
// process meets a live lease of a dead worker.
func TestYoungLeaseOfDeadWorkerIsWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r1 := liveRunner(t, db, "w1", nil)
	rep, err := r1.Run(ctx, liveJob(nil))
	require.NoError(t, err)
	// As after a kill -9: the run running, chunk 0 pending, leased just
	// now by a worker whose last heartbeat is 31 s old.
	db.MustExec(`UPDATE backfill.runs SET status = 'running', finished_at = NULL WHERE batch_id = $1`, rep.BatchID)
	db.MustExec(`UPDATE backfill.chunks SET status = 'pending', lease_key = 'dead', lease_epoch = lease_epoch + 1,
		leased_at = now() WHERE batch_id = $1 AND seq = 0`, rep.BatchID)
	db.MustExec(`DELETE FROM live WHERE id < 10`)
	m := r1.cfg.Manifest.(*PGManifest)
	require.NoError(t, m.RegisterWorker(ctx, r1.db, backfilltype.Worker{Key: "dead", ID: "killed", BatchID: rep.BatchID, Job: "live", StaleAfter: 30 * time.Second}))
	db.MustExec(`UPDATE backfill.workers SET heartbeat_at = now() - interval '31 s' WHERE worker_key = 'dead'`)

	var logs syncBuffer
	r2 := liveRunner(t, db, "w2", &logs)
	r2.cfg.StaleAfter, r2.cfg.HeartbeatInterval = 30*time.Second, time.Second
	done := make(chan runResult, 1)
	go func() {
		rep, err := r2.Run(ctx, liveJob(nil))
		done <- runResult{rep, err}
	}()
	const waiting = `"msg":"backfill: waiting for a chunk in flight"`
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(logs.String(), waiting) {
		select {
		case res := <-done:
			t.Fatalf("the new process returned without waiting for the young lease: %+v, %v\nchunks: %v", res.rep, res.err, chunkStatuses(t, db))
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the new process never waited for the young lease")
	}
	// The lease goes stale: the waiting process takes it over.
	db.MustExec(`UPDATE backfill.chunks SET leased_at = now() - interval '31 s' WHERE batch_id = $1 AND seq = 0`, rep.BatchID)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, RunCompleted, res.rep.Status)
	require.Equal(t, 1, res.rep.ChunksRun, "the new process took the lease over")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live`))
	require.Equal(t, 10*liveChunks, n)
}

// TestClaimWalksClaimableIndex: the claim (ClaimChunk) and the lease
// (LeaseChunk) of a long plan walk the index of claimable
// chunks in seq order and stop at the first row, with no sort of the
// batch's chunks: a new plan (every chunk pending) and one whose chunks
// are nearly all done. A bitmap scan and a sort of every pending chunk
// made a claim cost time in proportion to the plan.
func TestClaimWalksClaimableIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	ch := IntRange(0, n, 1)
	chunks, err := ch.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want int) {
		t.Helper()
		for name, q := range map[string]struct {
			sql  string
			args []any
		}{
			"claim": {pgstore.ClaimQuery, []any{run.BatchID, "{}"}},
			// The lease's statement, in its function lease_chunk, with the
			// generic plan the function keeps.
			"lease": {"", []any{run.BatchID, "{}", "k", 30.0}},
		} {
			err := pgstore.InTx(ctx, db, func(tx sqlx.ExtContext) error {
				var plan []string
				if q.sql == "" {
					var src string
					if err := sqlx.GetContext(ctx, tx, &src, `SELECT prosrc FROM pg_proc WHERE oid = 'backfill.lease_chunk'::regproc`); err != nil {
						return err
					}
					i, j := strings.Index(src, "RETURN QUERY"), strings.LastIndex(src, ";")
					if i < 0 || j < i {
						t.Fatalf("lease_chunk: no RETURN QUERY statement in\n%s", src)
					}
					stmt := strings.NewReplacer("p_batch_id", "$1", "p_avoid", "$2", "p_key", "$3", "p_stale_after", "$4").Replace(src[i+len("RETURN QUERY") : j])
					if _, err := tx.ExecContext(ctx, `SET LOCAL plan_cache_mode = force_generic_plan; PREPARE lease_generic (bigint, int[], text, float8) AS `+stmt); err != nil {
						return err
					}
					defer tx.ExecContext(ctx, `DEALLOCATE lease_generic`)
					if err := sqlx.SelectContext(ctx, tx, &plan, fmt.Sprintf(`EXPLAIN (COSTS OFF) EXECUTE lease_generic (%d, '{}', 'k', 30)`, run.BatchID)); err != nil {
						return err
					}
				} else if err := sqlx.SelectContext(ctx, tx, &plan, `EXPLAIN (COSTS OFF) `+pm.SQL(q.sql), q.args...); err != nil {
					return err
				}
				p := strings.Join(plan, "\n")
				if !strings.Contains(p, "Index Scan using chunks_claimable on chunks") || strings.Contains(p, "Sort") || strings.Contains(p, "Bitmap Heap Scan on chunks") {
					t.Errorf("%s, %s: want an index scan of chunks_claimable without a sort, plan:\n%s", when, name, p)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		st, ok, err := pm.ClaimChunk(ctx, tx, run.BatchID)
		if err != nil || !ok || st.Chunk.Seq != want {
			t.Fatalf("%s: claim: %v, %v, chunk %d, want %d", when, ok, err, st.Chunk.Seq, want)
		}
	}
	check("new plan", 0)
	if _, err := db.Exec(`UPDATE backfill.chunks SET status = 'done' WHERE batch_id = $1 AND seq < $2`, run.BatchID, n-10); err != nil {
		t.Fatal(err)
	}
	check("nearly done", n-10)
}

// TestStartRunLongPlan: a plan of more chunks than one insert statement
// takes (insertChunksBatch) is recorded whole, each chunk once and in
// order, and resumes as the same run.
func TestStartRunLongPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		t.Fatal(err)
	}
	n := 2*pgstore.InsertChunksBatch + 3
	ch := IntRange(0, int64(n)*2, 2)
	chunks, err := ch.Chunks(ctx)
	if err != nil || len(chunks) != n {
		t.Fatalf("chunks: %d, %v", len(chunks), err)
	}
	job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	plan := NewPlan(job, TableInfo{Target: job.Target}, chunks)
	run, _, err := pm.StartRun(ctx, db, plan, "w", false)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		N, Seqs, IDs, Bad int
		Min, Max          int
	}
	if err := db.Get(&got, `SELECT count(*) AS n, count(DISTINCT seq) AS seqs, count(DISTINCT chunk_id) AS ids,
		count(*) FILTER (WHERE lo <> seq * 2 OR hi <> seq * 2 + 2 OR chunk_id <> 'int:' || lo || '/' || hi OR status <> 'pending') AS bad,
		min(seq), max(seq) FROM backfill.chunks WHERE batch_id = $1`, run.BatchID); err != nil {
		t.Fatal(err)
	}
	if got.N != n || got.Seqs != n || got.IDs != n || got.Bad != 0 || got.Min != 0 || got.Max != n-1 {
		t.Fatalf("chunks recorded: %+v, want %d in order", got, n)
	}
	again, resumed, err := pm.StartRun(ctx, db, plan, "w", false)
	if err != nil || !resumed || again.BatchID != run.BatchID {
		t.Fatalf("resume: batch %d (want %d), resumed %v, %v", again.BatchID, run.BatchID, resumed, err)
	}
}

// BenchmarkClaimDone: a claim (ClaimChunk in a transaction rolled back)
// and a lease (LeaseChunk, then ReleaseLease) of a run whose chunks are
// all done but the last 10 (set done in one UPDATE, so the index of
// claimable chunks still holds their dead entries), at 1,000, 100,000
// and 1,000,000 chunks (CLAIM_SIZES=n,... for others); then the same
// after a VACUUM of the chunks table (-vacuumed). It also logs what the
// plan and StartRun cost (time, allocations, heap in use with the plan
// held). Reports only (ns/op); CLAIM_EXPLAIN=1 logs the claim's plan.
//
//	go test -run '^$' -bench BenchmarkClaimDone -benchtime 20x -v .
func BenchmarkClaimDone(b *testing.B) {
	sizes := []int{1_000, 100_000, 1_000_000}
	if s := os.Getenv("CLAIM_SIZES"); s != "" { // e.g. CLAIM_SIZES=100000
		sizes = sizes[:0]
		for _, f := range strings.Split(s, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n < 20 {
				b.Fatalf("CLAIM_SIZES: %q", f)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			pm := NewPGManifest("")
			if err := pm.Init(ctx, db); err != nil {
				b.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			begin := time.Now()
			ch := IntRange(0, int64(n), 1)
			chunks, err := ch.Chunks(ctx)
			if err != nil {
				b.Fatal(err)
			}
			job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
			run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
			if err != nil {
				b.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			b.Logf("%d chunks: plan and StartRun %v, %.1f MiB allocated, heap in use %.1f MiB",
				n, time.Since(begin).Round(time.Millisecond), float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), float64(after.HeapInuse)/(1<<20))
			explain := func(when string) {
				if os.Getenv("CLAIM_EXPLAIN") == "" {
					return
				}
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				var plan []string
				if err := sqlx.SelectContext(ctx, tx, &plan, `EXPLAIN (ANALYZE, BUFFERS) `+pm.SQL(pgstore.ClaimQuery), run.BatchID, "{}"); err != nil {
					b.Fatal(err)
				}
				b.Log(when + ":\n" + strings.Join(plan, "\n"))
			}
			explain("all pending")
			if _, err := db.Exec(`UPDATE backfill.chunks SET status = 'done' WHERE batch_id = $1 AND seq < $2`, run.BatchID, n-10); err != nil {
				b.Fatal(err)
			}
			claim := func() {
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				st, ok, err := pm.ClaimChunk(ctx, tx, run.BatchID)
				if err != nil || !ok || st.Chunk.Seq != n-10 {
					b.Fatalf("claim: %v %v %+v", ok, err, st.Chunk)
				}
			}
			claim() // the first scan marks the done chunks' index entries dead
			explain("done")
			b.Run("claim", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					claim()
				}
			})
			lease := func(b *testing.B) {
				l := backfilldriver.Lease{Key: "k", StaleAfter: 30 * time.Second, JobConcurrency: 4}
				for i := 0; i < b.N; i++ {
					cl, ok, _, err := pm.LeaseChunk(ctx, db, run.BatchID, l)
					if err != nil || !ok {
						b.Fatalf("lease: %v %v", ok, err)
					}
					if err := pm.ReleaseLease(ctx, db, run.BatchID, cl.State.Chunk.Seq, "k", cl.Epoch); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("lease", lease)
			// What the autovacuum does to the table as done chunks
			// accumulate: the done chunks' entries leave the index.
			if _, err := db.Exec(`VACUUM backfill.chunks`); err != nil {
				b.Fatal(err)
			}
			b.Run("claim-vacuumed", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					claim()
				}
			})
			b.Run("lease-vacuumed", lease)
		})
	}
}
