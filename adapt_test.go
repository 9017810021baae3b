package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// skewedJob is a job over keys [0, 1000) in chunks of 100 keys: key k
// yields one row (id k*100), except in the heavy chunk [300, 400), where
// it yields heavy rows (ids k*100 .. k*100+heavy-1). Every Extract call's
// chunk is appended to calls.
func skewedJob(name string, heavy int64, calls *extractCalls) backfill.Job {
	return backfill.Job{Name: name, Chunker: backfill.IntRange(0, 1000, 100),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			calls.add(c)
			for k := c.Lo; k < c.Hi; k++ {
				n := int64(1)
				if k >= 300 && k < 400 {
					n = heavy
				}
				for j := range n {
					if err := w.Write(ctx, k*100+j, fmt.Sprintf("k%d", k), int64(k)); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}}}
}

// itemsRange is job name over the items table: one row (k, "k<k>", k)
// for each key k of its chunker's integer chunks.
func itemsRange(name string, ch backfill.Chunker) backfill.Job {
	return backfill.Job{Name: name, Chunker: ch,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for k := c.Lo; k < c.Hi; k++ {
				if err := w.Write(ctx, k, fmt.Sprintf("k%d", k), k); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}}}
}

type extractCalls struct {
	mu sync.Mutex
	cs []backfill.Chunk
}

func (e *extractCalls) add(c backfill.Chunk) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cs = append(e.cs, c)
}

func (e *extractCalls) all() []backfill.Chunk {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]backfill.Chunk(nil), e.cs...)
}

// subRow is a row of backfill.subchunks.
type subRow struct {
	Seq   int    `db:"seq"`
	Pos   int    `db:"pos"`
	Lo    string `db:"lo"`
	Hi    string `db:"hi"`
	Read  int64  `db:"rows_read"`
	Ins   int64  `db:"rows_inserted"`
	Upd   int64  `db:"rows_updated"`
	Unch  int64  `db:"rows_unchanged"`
	Split bool   `db:"split"`
}

func subchunkRows(t *testing.T, db *sqlx.DB, batch int64) []subRow {
	t.Helper()
	var rows []subRow
	require.NoError(t, db.Select(&rows, `SELECT seq, pos, lo, hi, rows_read, rows_inserted, rows_updated, rows_unchanged, split
		FROM backfill.subchunks WHERE batch_id = $1 ORDER BY seq, pos`, batch))
	return rows
}

// requireTiles checks that the sub-chunks of seq tile [lo, hi) in order,
// each with at most maxRows rows, and sum to the plan chunk's counts as
// the manifest records them; it returns how many there are.
func requireTiles(t *testing.T, db *sqlx.DB, batch int64, seq int, lo, hi string, maxRows int64) int {
	t.Helper()
	var n int
	var read, ins, upd, unch int64
	next := lo
	for _, s := range subchunkRows(t, db, batch) {
		if s.Seq != seq {
			continue
		}
		require.Equal(t, n, s.Pos)
		require.Equal(t, next, s.Lo, "sub-chunk %d starts where the one before ended", s.Pos)
		require.LessOrEqual(t, s.Read, maxRows, "sub-chunk %d [%s, %s)", s.Pos, s.Lo, s.Hi)
		require.Equal(t, s.Read, s.Ins+s.Upd+s.Unch)
		next = s.Hi
		read, ins, upd, unch = read+s.Read, ins+s.Ins, upd+s.Upd, unch+s.Unch
		n++
	}
	require.Equal(t, hi, next, "the sub-chunks cover the plan chunk")
	var c struct {
		Status string `db:"status"`
		Read   int64  `db:"rows_read"`
		Ins    int64  `db:"rows_inserted"`
		Upd    int64  `db:"rows_updated"`
		Unch   int64  `db:"rows_unchanged"`
	}
	require.NoError(t, db.Get(&c, `SELECT status, rows_read, rows_inserted, rows_updated, rows_unchanged FROM backfill.chunks WHERE batch_id = $1 AND seq = $2`, batch, seq))
	require.Equal(t, "done", c.Status)
	require.Equal(t, [4]int64{read, ins, upd, unch}, [4]int64{c.Read, c.Ins, c.Upd, c.Unch}, "the plan chunk's counts are its sub-chunks' sums")
	return n
}

// requireItemsOnce checks that items holds every row of skewedJob once,
// as loaded.
func requireItemsOnce(t *testing.T, db *sqlx.DB, heavy int64) {
	t.Helper()
	var n, distinct int64
	require.NoError(t, db.QueryRow(`SELECT count(*), count(DISTINCT id) FROM items WHERE name = 'k' || qty`).Scan(&n, &distinct))
	require.Equal(t, 900+100*heavy, n)
	require.Equal(t, n, distinct)
}

// TestAdaptSplitsSkewedChunk: with ChunkTarget and ChunkMaxRows, the
// chunk with 50 times the rows of the others is worked through in
// sub-chunks of at most ChunkMaxRows rows, recorded in the manifest as a tiling of the plan chunk whose
// counts are the plan chunk's; the others run whole; the Extractor sees
// each sub-chunk with its own ID; the plan is unchanged.
func TestAdaptSplitsSkewedChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100})
	require.NoError(t, err)
	var calls extractCalls
	job := skewedJob("skew", 50, &calls)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(5900), rep.Counts.Read)
	require.Equal(t, int64(5900), rep.Counts.Inserted)
	requireItemsOnce(t, db, 50)

	n := requireTiles(t, db, rep.BatchID, 3, "300", "400", 100)
	require.GreaterOrEqual(t, n, 50, "5000 rows in sub-chunks of at most 100")
	for _, s := range subchunkRows(t, db, rep.BatchID) {
		require.Equal(t, 3, s.Seq, "the other chunks run whole")
		require.False(t, s.Split)
	}
	var subIDs int
	for _, c := range calls.all() {
		if c.Lo >= 300 && c.Hi <= 400 && c.Hi-c.Lo < 100 {
			require.Equal(t, fmt.Sprintf("int:%d/%d", c.Lo, c.Hi), c.ID, "a sub-chunk's ID is its bounds'")
			require.Equal(t, 3, c.Seq)
			subIDs++
		}
	}
	require.GreaterOrEqual(t, subIDs, n)
	var chunks int
	require.NoError(t, db.Get(&chunks, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1`, rep.BatchID))
	require.Equal(t, 10, chunks, "the plan's chunks are unchanged")

	// The same rows again (a new run): the sub-chunks' rows are unchanged.
	job.NewRun = true
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(5900), rep2.Counts.Unchanged)
	requireTiles(t, db, rep2.BatchID, 3, "300", "400", 100)
	// A run without adaptation has the same plan.
	plain, err := backfill.New(db, &backfill.Config{Concurrency: 1})
	require.NoError(t, err)
	rep3, err := plain.Run(ctx, job)
	require.NoError(t, err)
	require.Empty(t, subchunkRows(t, db, rep3.BatchID))
	var fps []string
	require.NoError(t, db.Select(&fps, `SELECT DISTINCT plan_fingerprint FROM backfill.runs WHERE job_name = 'skew'`))
	require.Len(t, fps, 1, "the plan is frozen: sub-chunks do not change it")
}

// TestAdaptMaxRowsIsACap: ChunkMaxRows caps the rows of every sub-chunk,
// whatever the sizer's margin over the rows it wants: a chunk of one row
// per unit, where a span of 1.2 × the cap would hold 1.2 × the cap rows,
// is worked through in sub-chunks of at most ChunkMaxRows rows.
func TestAdaptMaxRowsIsACap(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100})
	require.NoError(t, err)
	job := itemsRange("cap", backfill.IntRange(0, 1000, 1000))
	rep, err := r.Run(t.Context(), job)
	require.NoError(t, err)
	require.Equal(t, int64(1000), rep.Counts.Inserted)
	n := requireTiles(t, db, rep.BatchID, 0, "0", "1000", 100)
	require.GreaterOrEqual(t, n, 10, "1000 rows in sub-chunks of at most 100")
}

// TestAdaptKnobs: the knobs change a running run's sizing from the next
// lease on: chunk_max_rows (set with SQL set_knob) raises the cap, and
// chunk_target_ms 0 (Runner.SetKnob) turns adaptation off, the heavy
// chunk then running whole.
func TestAdaptKnobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name, key, value string
		subs             func(t *testing.T, db *sqlx.DB, batch int64)
	}{
		{"cap", "chunk_max_rows", "1000", func(t *testing.T, db *sqlx.DB, batch int64) {
			n := requireTiles(t, db, batch, 3, "300", "400", 1500)
			require.GreaterOrEqual(t, n, 4)
			require.Less(t, n, 34, "a cap of 1000 rows, not 100")
		}},
		{"off", "chunk_target_ms", "0", func(t *testing.T, db *sqlx.DB, batch int64) {
			require.Empty(t, subchunkRows(t, db, batch))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			rbSetup(t, db)
			r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100})
			require.NoError(t, err)
			var calls extractCalls
			job := skewedJob("knob", 50, &calls)
			var once sync.Once
			// The knob is set while chunk 0 is merged; chunk 3 is leased after.
			job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, _ sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
				var err error
				once.Do(func() {
					if tc.key == "chunk_max_rows" {
						_, err = db.ExecContext(ctx, `SELECT backfill.set_knob($1::bigint, $2, $3, 'ann', 'test')`, s.BatchID, tc.key, tc.value)
					} else {
						err = r.SetKnob(ctx, s.BatchID, tc.key, tc.value, "ann", "test")
					}
				})
				return backfill.CheckResult{Check: "knob", Severity: backfill.SeverityError, Passed: true}, err
			})}
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			requireItemsOnce(t, db, 50)
			tc.subs(t, db, rep.BatchID)
		})
	}
	// A bad value is refused, naming the knob. A subtest of its own (not
	// parallel): a database the parent took would keep its pgtest
	// deadline running while the parallel subtests above wait for a
	// place, for minutes in a long package run.
	t.Run("bad value", func(t *testing.T) {
		db := pgtest.New(t)
		rbSetup(t, db)
		r, err := backfill.New(db, &backfill.Config{Concurrency: 1})
		require.NoError(t, err)
		var calls extractCalls
		rep, err := r.Run(ctx, skewedJob("bad", 1, &calls))
		require.NoError(t, err)
		_, err = db.Exec(`SELECT backfill.set_knob($1::bigint, 'chunk_max_rows', '-3', 'ann', 'test')`, rep.BatchID)
		require.ErrorContains(t, err, "chunk_max_rows")
	})
}

// TestAdaptResumesBetweenSubchunks: a call stopped in the middle of a
// split chunk (its context cancelled while its third sub-chunk's
// transaction runs: as a kill, that transaction rolls back) leaves the
// chunk pending with two sub-chunks committed; the next call goes on
// from the third without extracting the first two again, and every row
// is loaded once, the plan chunk's counts the sums.
func TestAdaptResumesBetweenSubchunks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100, RetryBackoff: time.Millisecond})
	require.NoError(t, err)
	var calls extractCalls
	job := skewedJob("resume", 50, &calls)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cut atomic.Bool
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, _ sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
		var n int
		if err := db.GetContext(ctx, &n, `SELECT count(*) FROM backfill.subchunks WHERE batch_id = $1 AND seq = 3`, s.BatchID); err != nil {
			return backfill.CheckResult{}, err
		}
		if s.Chunk.Seq == 3 && n == 2 && cut.CompareAndSwap(false, true) {
			cancel()
			return backfill.CheckResult{}, errors.New("cut")
		}
		return backfill.CheckResult{Check: "cut", Severity: backfill.SeverityError, Passed: true}, nil
	})}
	_, err = r.Run(cctx, job)
	require.Error(t, err)
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'resume'`))
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.chunks WHERE batch_id = $1 AND seq = 3`, batch))
	require.Equal(t, "pending", status)
	subs := subchunkRows(t, db, batch)
	require.Len(t, subs, 2)
	resumeAt := subs[1].Hi

	before := len(calls.all())
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, batch, rep.BatchID)
	requireItemsOnce(t, db, 50)
	requireTiles(t, db, batch, 3, "300", "400", 150)
	for _, c := range calls.all()[before:] {
		if c.Seq == 3 {
			require.GreaterOrEqual(t, fmt.Sprint(c.Lo), resumeAt, "the committed sub-chunks are not extracted again")
			require.GreaterOrEqual(t, c.Lo, int64(300))
		}
	}
	require.Equal(t, int64(5900), rep.Counts.Read)
	require.Equal(t, int64(5900), rep.Counts.Inserted)
}

// TestAdaptStatementTimeoutSplits: a chunk whose transaction cannot
// finish within StatementTimeout (a trigger sleeps in any transaction
// that inserts more than 200 rows) is split and retried until its
// sub-chunks fit, with no attempt counted, and its rows are loaded once.
func TestAdaptStatementTimeoutSplits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	db.MustExec(`CREATE FUNCTION slow_bulk() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE n int := coalesce(nullif(current_setting('adapt_test.n', true), ''), '0')::int + 1;
		BEGIN
			PERFORM set_config('adapt_test.n', n::text, true);
			IF n = 201 THEN PERFORM pg_sleep(60); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow_bulk BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION slow_bulk();`)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, StatementTimeout: time.Second, MaxAttempts: 1})
	require.NoError(t, err)
	var calls extractCalls
	rep, err := r.Run(ctx, skewedJob("timeout", 10, &calls))
	require.NoError(t, err)
	requireItemsOnce(t, db, 10)
	n := requireTiles(t, db, rep.BatchID, 3, "300", "400", 200)
	require.GreaterOrEqual(t, n, 5)
	var split int
	require.NoError(t, db.Get(&split, `SELECT count(*) FROM backfill.subchunks WHERE batch_id = $1 AND split`, rep.BatchID))
	require.Positive(t, split)
	var attempts int
	require.NoError(t, db.Get(&attempts, `SELECT attempts FROM backfill.chunks WHERE batch_id = $1 AND seq = 3`, rep.BatchID))
	require.Equal(t, 1, attempts)
}

// TestAdaptRollbackRestores: a rollback of a batch whose chunk was split
// restores the target exactly: rows the sub-chunks updated get their
// prior image back, rows they inserted go.
func TestAdaptRollbackRestores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	db.MustExec(`INSERT INTO items (id, name, qty) SELECT k * 100 + j, 'old', -1 FROM generate_series(300, 399, 7) k, generate_series(0, 9) j`)
	snapshot := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT coalesce(string_agg(format('%s/%s/%s', id, name, qty), ',' ORDER BY id), '') FROM items`))
		return s
	}
	before := snapshot()
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100})
	require.NoError(t, err)
	var calls extractCalls
	job := skewedJob("rb", 50, &calls)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(150), rep.Counts.Updated)
	requireTiles(t, db, rep.BatchID, 3, "300", "400", 150)
	require.NotEqual(t, before, snapshot())
	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, before, snapshot())
}

func init() {
	// The child process of TestAdaptKillDashNineBetweenSubchunks: the
	// skewed job in sub-chunks of 100 rows, each extraction a little slow
	// (the heavy chunk's 50 sub-chunks take half a second at least), until
	// the parent kills it.
	childProcess("BACKFILL_ADAPT_CRASH_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, adaptCrashConfig())
		if err != nil {
			return err
		}
		var calls extractCalls
		job := skewedJob("crash", 50, &calls)
		inner := job.Extractor
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			time.Sleep(10 * time.Millisecond)
			return inner.Extract(ctx, c, w)
		})
		_, err = r.Run(context.Background(), job)
		return err
	})
}

func adaptCrashConfig() *backfill.Config {
	return &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100,
		HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second}
}

// TestAdaptKillDashNineBetweenSubchunks: a worker process killed (SIGKILL)
// twice while it works the heavy chunk in sub-chunks leaves the chunk
// pending with the sub-chunks it committed; the resume goes on from the
// last of them, and every row is loaded once, the plan chunk's counts the
// sums of its sub-chunks', in one batch.
func TestAdaptKillDashNineBetweenSubchunks(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	rbSetup(t, db)
	var after []int
	for _, n := range []int{3, 20} {
		killChildWhen(t, db, "BACKFILL_ADAPT_CRASH_CHILD", url, `SELECT count(*) FROM backfill.subchunks WHERE seq = 3`, n)
		var got int
		require.NoError(t, db.Get(&got, `SELECT count(*) FROM backfill.subchunks WHERE seq = 3`))
		after = append(after, got)
	}
	require.Less(t, after[1], 50, "killed before the heavy chunk's end")
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.chunks WHERE seq = 3`))
	require.Equal(t, "pending", status)

	r, err := backfill.New(db, adaptCrashConfig())
	require.NoError(t, err)
	var calls extractCalls
	rep, err := r.Run(context.Background(), skewedJob("crash", 50, &calls))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	requireItemsOnce(t, db, 50)
	requireTiles(t, db, rep.BatchID, 3, "300", "400", 150)
	require.Equal(t, backfill.Counts{Read: 5900, Inserted: 5900}, rep.Counts, "no row counted twice")
	for _, c := range calls.all() {
		require.False(t, c.Seq == 3 && c.Lo < 300+int64(after[1])*2, "sub-chunk %s committed before the kills extracted again", c.ID)
	}
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, runs)
}

// TestAdaptRollbackOfChunkLeftMidway: a run that failed in the middle of
// a split chunk (its third sub-chunk's validation fails, the chunk's
// last attempt) leaves the chunk failed with two sub-chunks committed;
// a rollback of the batch restores their rows too, exactly.
func TestAdaptRollbackOfChunkLeftMidway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	db.MustExec(`INSERT INTO items (id, name, qty) SELECT k * 100 + j, 'old', -1 FROM generate_series(300, 399) k, generate_series(0, 9) j`)
	snapshot := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT coalesce(string_agg(format('%s/%s/%s', id, name, qty), ',' ORDER BY id), '') FROM items`))
		return s
	}
	before := snapshot()
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100, MaxAttempts: 1})
	require.NoError(t, err)
	var calls extractCalls
	job := skewedJob("midway", 50, &calls)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, _ sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
		if s.Chunk.Seq == 3 && s.Chunk.Lo >= 304 {
			return backfill.CheckResult{}, errors.New("cut")
		}
		return backfill.CheckResult{Check: "cut", Severity: backfill.SeverityError, Passed: true}, nil
	})}
	_, err = r.Run(ctx, job)
	require.Error(t, err)
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'midway'`))
	require.Len(t, subchunkRows(t, db, batch), 2)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.chunks WHERE batch_id = $1 AND seq = 3`, batch))
	require.NotEqual(t, "done", status)
	require.NotEqual(t, before, snapshot(), "the two sub-chunks' rows are in the target")
	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	require.Equal(t, before, snapshot())
}

// TestAdaptTimeSubchunksOnMicroseconds: sub-chunks of a time chunk have
// bounds on whole microseconds (PostgreSQL's precision), so an extractor
// that selects ts >= Start AND ts < End gets exactly the sub-chunk's rows:
// with a row every microsecond, none falls outside its sub-chunk. Then a
// dense burst after a sparse stretch of one chunk: the sizer reaches it
// in a bounded number of extractions instead of going back and forth.
func TestAdaptTimeSubchunksOnMicroseconds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE src (ts timestamptz PRIMARY KEY);
		CREATE TABLE ev (ts timestamptz PRIMARY KEY, backfill_inserted_by bigint, backfill_updated_by bigint);
		INSERT INTO src SELECT timestamptz '2024-03-10 12:00:00Z' + make_interval(secs => i / 1e6) FROM generate_series(1, 20000) i;
		INSERT INTO src SELECT timestamptz '2024-03-10 00:00:00Z' + make_interval(mins => i) FROM generate_series(0, 1439) i
			ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	var extracts atomic.Int64
	job := func(name string, c backfill.Chunker) backfill.Job {
		return backfill.Job{Name: name, Chunker: c, MergeEveryChunk: true,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				extracts.Add(1)
				rows, err := db.QueryContext(ctx, `SELECT ts FROM src WHERE ts >= $1 AND ts < $2`, c.Start, c.End)
				if err != nil {
					return err
				}
				defer rows.Close()
				for rows.Next() {
					var ts time.Time
					if err := rows.Scan(&ts); err != nil {
						return err
					}
					if err := w.Write(ctx, ts); err != nil {
						return err
					}
				}
				return rows.Err()
			}),
			Target: backfill.Target{Table: "ev", Key: []string{"ts"}, Columns: []string{"ts"}}}
	}
	noon := time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)
	r, err := backfill.New(db, &backfill.Config{ChunkTarget: time.Hour, ChunkMaxRows: 333})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job("micro", backfill.Every(noon, noon.Add(30*time.Millisecond), 10*time.Millisecond, time.UTC)))
	require.NoError(t, err)
	require.Zero(t, rep.Counts.Rejected, "no row outside its sub-chunk")
	require.Equal(t, int64(20001), rep.Counts.Inserted, "noon's minute row and the burst's")

	// One day: a row a minute, and the 20,000 rows of noon's 20 ms.
	_, err = db.Exec(`TRUNCATE ev`)
	require.NoError(t, err)
	extracts.Store(0)
	day := time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC)
	rep, err = r.Run(ctx, job("burst", backfill.Days(day, day.AddDate(0, 0, 1), time.UTC)))
	require.NoError(t, err)
	require.Zero(t, rep.Counts.Rejected)
	require.Equal(t, int64(20000+1440), rep.Counts.Inserted)
	subs := subchunkRows(t, db, rep.BatchID)
	t.Logf("%d sub-chunks, %d extractions", len(subs), extracts.Load())
	require.Less(t, len(subs), 120, "about 30 sub-chunks of the burst, a few of the sparse hours")
	require.Less(t, extracts.Load(), int64(3*len(subs)+40), "extractions per sub-chunk stay bounded")
}

// TestAdaptRowNumbersNameThePlanChunksRows: the exceptions of a chunk
// worked through in sub-chunks are numbered on through the plan chunk
// (filed under its ID), not from 1 in each sub-chunk: each (chunk, row)
// names one row.
func TestAdaptRowNumbersNameThePlanChunksRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE nums (id bigint PRIMARY KEY, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job := backfill.Job{Name: "nums", Chunker: backfill.IntRange(0, 2000, 1000), MaxRunRejectRate: 1,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				var err error
				if id%13 == 0 {
					err = w.Reject(ctx, id, "id", "unlucky")
				} else {
					err = w.Write(ctx, id)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "nums", Key: []string{"id"}, Columns: []string{"id"}}}
	r, err := backfill.New(db, &backfill.Config{ChunkTarget: time.Hour, ChunkMaxRows: 100})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Greater(t, len(subchunkRows(t, db, rep.BatchID)), 2, "the chunks were split")
	var ex []struct {
		Chunk string `db:"chunk_id"`
		Row   int64  `db:"row_number"`
		Raw   string `db:"raw"`
	}
	require.NoError(t, db.Select(&ex, `SELECT chunk_id, row_number, raw::text AS raw FROM backfill.exceptions WHERE batch_id = $1`, rep.BatchID))
	require.Len(t, ex, 154) // 0, 13, ..., 1989
	for _, e := range ex {
		lo := int64(0)
		if e.Chunk == "int:1000/2000" {
			lo = 1000
		}
		require.Equal(t, fmt.Sprint(lo+e.Row-1), e.Raw, "row %d of %s", e.Row, e.Chunk)
	}
}

// TestAdaptMaxRejectsPerPlanChunk: MaxRejectsPerChunk bounds a plan
// chunk's rejects summed over its sub-chunks, not each sub-chunk's: the
// heavy chunk rejects one row in ten (500 rows in sub-chunks of at most
// 120, none with more than 12), and a limit of 100 fails it with an
// error wrapping ErrTooManyRejects that names the chunk; the sub-chunks
// committed before hold at most 100 rejects.
func TestAdaptMaxRejectsPerPlanChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100, MaxRejectsPerChunk: 100, MaxAttempts: 1})
	require.NoError(t, err)
	job := backfill.Job{Name: "rejects", Chunker: backfill.IntRange(0, 1000, 100),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for k := c.Lo; k < c.Hi; k++ {
				n := int64(1)
				if k >= 300 && k < 400 {
					n = 50
				}
				for j := range n {
					var qty any = k
					if n > 1 && j%10 == 0 {
						qty = "not a number"
					}
					if err := w.Write(ctx, k*100+j, fmt.Sprintf("k%d", k), qty); err != nil {
						return err
					}
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}}}
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrTooManyRejects)
	require.ErrorContains(t, err, "int:300/400")
	require.ErrorContains(t, err, "sub-chunks committed before")
	var batch int64
	require.NoError(t, db.Get(&batch, `SELECT batch_id FROM backfill.runs WHERE job_name = 'rejects'`))
	var rejected, subs int64
	require.NoError(t, db.QueryRow(`SELECT coalesce(sum(rows_rejected), 0), count(*) FROM backfill.subchunks WHERE batch_id = $1 AND seq = 3`, batch).Scan(&rejected, &subs))
	require.Greater(t, subs, int64(1), "the chunk was worked in sub-chunks")
	require.LessOrEqual(t, rejected, int64(100))
	require.Greater(t, rejected, int64(80), "the sub-chunks before the failing one committed")
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.chunks WHERE batch_id = $1 AND seq = 3`, batch))
	require.Equal(t, "failed", status)
}

// TestAdaptSubchunksPacedByRate: the rows-per-second cap paces the
// sub-chunks of a plan chunk as it paces chunks: a sub-chunk's rows are
// charged when it commits, and the next sub-chunk waits until they are
// paid for, so a plan chunk of 400 rows in sub-chunks of about 100 at 100
// rows per second waits (throttle periods of signal rows_per_second)
// before its own end; without the pacing its sub-chunks ran one after
// another and the only wait came at the next claim.
func TestAdaptSubchunksPacedByRate(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 1, ChunkTarget: time.Hour, ChunkMaxRows: 100, RowsPerSecond: 100,
		ThrottleInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	job := itemsRange("paced", backfill.IntRange(0, 400, 400))
	rep, err := r.Run(t.Context(), job)
	require.NoError(t, err)
	require.Equal(t, int64(400), rep.Counts.Inserted)
	n := requireTiles(t, db, rep.BatchID, 0, "0", "400", 150)
	require.GreaterOrEqual(t, n, 3, "400 rows in sub-chunks of at most 150")
	var waits int
	require.NoError(t, db.Get(&waits, `SELECT count(*) FROM backfill.throttle_periods p JOIN backfill.chunks c USING (batch_id)
		WHERE p.batch_id = $1 AND p.signal = 'rows_per_second' AND p.ended_at <= c.finished_at`, rep.BatchID))
	require.GreaterOrEqual(t, waits, n-2, "every sub-chunk after the first two (the first admitted with nothing reserved, the second within the burst) waited for the cap")
}
