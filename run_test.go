package backfill_test

import (
	"bytes"
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	neturl "net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// genRow is a source row of the accounting property test.
type genRow struct {
	ID   int64
	Name any // string, nil, or a bad value
	Bad  bool
}

// TestAccountingProperty generates chunks with duplicates, bad values and
// explicit rejects, runs them on PostgreSQL, and checks that every chunk
// balances, that the target equals a model (last row per key wins), and
// that running the same input again as a new run writes nothing.
func TestAccountingProperty(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	createItems(t, db)
	ctx := context.Background()
	iteration := 0
	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		_, err := db.Exec(`TRUNCATE items`)
		require.NoError(rt, err)
		nChunks := rapid.IntRange(1, 4).Draw(rt, "chunks")
		source := map[int64][]genRow{}
		for c := range nChunks {
			n := rapid.IntRange(0, 30).Draw(rt, fmt.Sprintf("rows%d", c))
			for range n {
				id := int64(c*100) + rapid.Int64Range(0, 12).Draw(rt, "id")
				r := genRow{ID: id}
				switch rapid.IntRange(0, 9).Draw(rt, "kind") {
				case 0:
					r.Name, r.Bad = "bad\x00nul", true
				case 1:
					r.Name, r.Bad = "far too long a name", true
				case 2:
					r.Bad = true // explicit reject
				case 3:
					r.Name = nil
				default:
					r.Name = rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "name")
				}
				source[int64(c)] = append(source[int64(c)], r)
			}
		}
		extract := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range source[c.Lo/100] {
				var err error
				if r.Bad && r.Name == nil {
					err = w.Reject(ctx, map[string]any{"id": r.ID}, "", "explicit")
				} else {
					err = w.Write(ctx, "t", r.ID, r.Name, nil, nil)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		job := backfill.Job{Name: fmt.Sprintf("prop-%d", iteration), Chunker: backfill.IntRange(0, int64(nChunks)*100, 100), Extractor: extract, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: "items", Key: []string{"tenant", "id"}, Columns: []string{"tenant", "id", "name", "amount", "seen_at"}}}
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2, ReturnOnPause: true})
		require.NoError(rt, err)
		rep, runErr := r.Run(ctx, job)

		// Model: per key, the last good row wins.
		model := map[int64]*string{}
		var read, rejected int64
		for _, rows := range source {
			for _, r := range rows {
				read++
				if r.Bad {
					rejected++
					continue
				}
				var name *string
				if s, ok := r.Name.(string); ok {
					name = &s
				}
				model[r.ID] = name
			}
		}
		allRejected := read > 0 && rejected == read
		if allRejected {
			// Nothing loaded: the run pauses rather than complete silently.
			require.ErrorIs(rt, runErr, backfill.ErrGateFailed)
			require.Equal(rt, backfill.RunPaused, rep.Status)
		} else {
			require.NoError(rt, runErr)
		}
		require.Equal(rt, read, rep.Counts.Read)
		require.Equal(rt, rejected, rep.Counts.Rejected)
		require.Equal(rt, int64(len(model)), rep.Counts.Inserted)
		require.Equal(rt, read-rejected-int64(len(model)), rep.Counts.Deduplicated)
		for _, c := range manifestChunks(t, db, rep.BatchID) {
			require.True(rt, c.Balanced(), "chunk %s: %+v", c.Chunk.ID, c.Counts)
		}
		got := itemRows(t, db)
		require.Len(rt, got, len(model))
		for _, g := range got {
			want, ok := model[g.ID]
			require.True(rt, ok)
			require.Equal(rt, want, g.Name, "id %d", g.ID)
		}

		job.NewRun = true
		rep2, err := r.Run(ctx, job)
		if allRejected {
			require.ErrorIs(rt, err, backfill.ErrGateFailed)
		} else {
			require.NoError(rt, err)
		}
		require.Zero(rt, rep2.Counts.Inserted+rep2.Counts.Updated, "replay writes nothing: %+v", rep2.Counts)
		require.Equal(rt, rep.Counts.Read, rep2.Counts.Read)
	})
}

// untilLockWait polls until some backend of db's database other than
// those of ignore waits for a lock (advisory, row or transaction), or done
// yields (the waiter it expected finished without waiting). It reports
// whether a waiter was seen. The deadline only keeps a broken build from
// hanging; nothing is asserted about time.
func untilLockWait(t *testing.T, db *sqlx.DB, done <-chan struct{}) bool {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid())`))
		if waiting {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("no backend waited for a lock")
	return false
}

// History: closing an interval of a row that an application is updating
// (uncommitted) must log, as the undo image, the row the merge actually
// overwrote (the application's committed update), so that rolling the
// batch back keeps the application's change. The family: every statement
// that writes the target and logs a prior image locks its rows first.
func TestHistoryCloseLogsRowItOverwrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(1), "Oslo"}}))
	require.NoError(t, err)

	app, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer app.Rollback() //nolint:errcheck
	app.MustExec(`UPDATE addr SET city = 'AppCity' WHERE customer = 'a1'`)
	done := make(chan struct{})
	var rep backfill.Report
	var runErr error
	go func() {
		defer close(done)
		rep, runErr = r.Run(ctx, addrJob("addr", [][]any{{"a1", d(10), "Rome"}}))
	}()
	require.True(t, untilLockWait(t, db, done), "run 2 must wait for the application's row")
	require.NoError(t, app.Commit())
	<-done
	require.NoError(t, runErr)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT row(customer, valid_from::date, valid_to::date, city)::text FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"(a1,2024-01-01,2024-01-10,AppCity)", "(a1,2024-01-10,,Rome)"}, rows)

	_, err = r.Rollback(ctx, addrJob("addr", nil), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "t", Why: "test"})
	require.NoError(t, err)
	rows = nil
	require.NoError(t, db.Select(&rows, `SELECT row(customer, valid_from::date, valid_to::date, city)::text FROM addr ORDER BY valid_from`))
	require.Equal(t, []string{"(a1,2024-01-01,,AppCity)"}, rows, "the rollback restored a stale image over the application's committed update")
}

// Rollback vs a run delivering the same rows: batch 2 delivers batch 1's
// rows unchanged and, while its chunk is between merge and commit, batch 1
// is rolled back. The rollback must wait for the merge (the target's merge
// lock), then see batch 2's delivery and refuse; it must never delete rows
// a completed, still-applied batch delivered.
//
// The same through PgBouncer in transaction mode: the rollback's lock is a
// transaction lock in each of its transactions, never a
// session lock that the pooler would leave on a shared server connection.
func TestRollbackWaitsForMergeOfSameTarget(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		rollbackWaitsForMerge(t, pgtest.New(t))
	})
	t.Run("pooler", func(t *testing.T) {
		t.Parallel()
		db, err := sqlx.Open("postgres", pgtest.NewPoolerURL(t))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		rollbackWaitsForMerge(t, db)
	})
}

func rollbackWaitsForMerge(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	rbSetup(t, db)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rows := [][]any{{int64(1), "same", int64(1)}, {int64(2), "same", int64(2)}}
	rep1, err := r.Run(ctx, itemsJob("items", rows))
	require.NoError(t, err)

	job2 := itemsJob("items2", rows)
	merged, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	job2.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		once.Do(func() { close(merged) })
		<-release // the chunk's transaction stays open, its merge done
		return backfill.CheckResult{Check: "pause", Passed: true}, nil
	})}
	runDone := make(chan error, 1)
	var rep2 backfill.Report
	go func() {
		var err error
		rep2, err = r.Run(ctx, job2)
		runDone <- err
	}()
	<-merged
	rbDone := make(chan struct{})
	var rbErr error
	go func() {
		defer close(rbDone)
		_, rbErr = r.Rollback(ctx, itemsJob("items", nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "t", Why: "test"})
	}()
	waited := untilLockWait(t, db, rbDone)
	close(release)
	require.NoError(t, <-runDone)
	<-rbDone
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM items`))
	require.Equal(t, 2, n, "the rollback deleted the rows batch 2 delivered (rollback error: %v)", rbErr)
	require.True(t, waited, "the rollback did not wait for the merge")
	require.ErrorIs(t, rbErr, backfill.ErrRollbackConflict)
}

// TargetWins: chunks of one run that disagree on a new key's content leave
// the row of the first to commit, which depends on commit order. On a
// target with lineage columns, the merge sees that the row another chunk
// of the same batch wrote differs and the run warns, naming the fix.
func TestTargetWinsWarnsWhenChunksOfRunDisagree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	rbSetup(t, db)
	var log bytes.Buffer
	var mu sync.Mutex
	r, err := backfill.New(db, &backfill.Config{Logger: slog.New(slog.NewTextHandler(syncWriter{&log, &mu}, nil))})
	require.NoError(t, err)
	job := backfill.Job{Name: "tw", Chunker: backfill.IntRange(0, 30, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			name := fmt.Sprintf("chunk%d", c.Lo/10)
			if c.Lo == 20 {
				name = "chunk0" // the name of chunk 0, but another qty: still a disagreement
			}
			return w.Write(ctx, int64(1000), name, c.Lo)
		}),
		Target: backfill.Target{Table: "items", Key: []string{"id"}, Columns: []string{"id", "name", "qty"}, Conflict: backfill.TargetWins}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Counts.Inserted)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, log.String(), "chunks of this run disagree on keys")
	require.Equal(t, 2, strings.Count(log.String(), "chunks of this run disagree on keys"), "chunks 1 and 2 differ from chunk 0's row")

	// Chunks that agree do not warn.
	db.MustExec(`TRUNCATE items`)
	log.Reset()
	mu.Unlock()
	job.Name, job.NewRun = "tw2", true
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, int64(1000), "same", int64(7))
	})
	_, err = r.Run(ctx, job)
	mu.Lock()
	require.NoError(t, err)
	require.NotContains(t, log.String(), "disagree")
}

// crashJob is the job run by the child process of TestKillDashNine: 40
// chunks of 250 rows with a little sleep per chunk, so that a kill lands in
// the middle of chunks.
func crashJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	job.Name = "crash"
	job.Chunker = backfill.IntRange(0, 10000, 250)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		time.Sleep(15 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	return job
}

// crashChild is the child process of TestKillDashNine (the library's
// default timings) and of TestThroughPoolerKillDashNine (pooledFencing): it
// runs the crash job with cfg; its last chunks never finish by themselves,
// the parent kills it.
func crashChild(cfg *backfill.Config) func(db *sqlx.DB) error {
	return func(db *sqlx.DB) error {
		r, err := backfill.New(db, cfg)
		if err != nil {
			return err
		}
		job := crashJob(&itemsSetup{db: db})
		inner := job.Extractor
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Lo >= 9000 {
				time.Sleep(time.Minute)
			}
			return inner.Extract(ctx, c, w)
		})
		_, err = r.Run(context.Background(), job)
		return err
	}
}

func init() {
	childProcess("BACKFILL_CRASH_CHILD", crashChild(&backfill.Config{Concurrency: 2}))
	childProcess("BACKFILL_CRASH_POOLED_CHILD", crashChild(pooledFencing(backfill.Config{Concurrency: 2})))
}

func createItems(t *testing.T, db *sqlx.DB) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12),
		amount numeric(10,2), seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
}

type itemRow struct {
	Tenant string  `db:"tenant"`
	ID     int64   `db:"id"`
	Name   *string `db:"name"`
	Amount *string `db:"amount"`
}

func itemRows(t *testing.T, db *sqlx.DB) []itemRow {
	t.Helper()
	var rows []itemRow
	require.NoError(t, db.Select(&rows, `SELECT tenant, id, name, amount::text AS amount FROM items ORDER BY tenant, id`))
	return rows
}

// TestKillDashNine kills a running backfill with SIGKILL at several points,
// resumes it, and checks that the target equals an uninterrupted run's and
// that no chunk was counted twice.
func TestKillDashNine(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()

	// Reference: an uninterrupted run.
	ref := pgtest.New(t)
	createItems(t, ref)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, crashJob(&itemsSetup{db: ref}))
	require.NoError(t, err)
	want := itemRows(t, ref)
	require.Len(t, want, 10000)

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	createItems(t, db)
	kills := 0
	for _, doneBeforeKill := range []int{3, 11, 24} {
		killChildWhen(t, db, "BACKFILL_CRASH_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, doneBeforeKill)
		kills++
	}
	require.Equal(t, 3, kills)

	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 40, "the child was killed before the end")

	// The resume with the library's defaults: it takes the killed child's
	// chunks over after DefaultStaleAfter (the other kill -9 tests resume
	// with a short StaleAfter, quickFencing).
	r, err = backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, crashJob(&itemsSetup{db: db}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 40-done, rep.ChunksRun, "resume ran only the chunks not done")
	require.Equal(t, backfill.Counts{Read: 10000, Inserted: 10000}, rep.Counts, "no chunk counted twice")
	if d := cmp.Diff(want, itemRows(t, db)); d != "" {
		t.Fatalf("target after kill -9 and resume differs from an uninterrupted run (-want +got):\n%s", d)
	}
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, runs, "every restart resumed the same batch")
}

// waitsJob is the job of TestKillDashNineWhileWaiting: 10 chunks of 100
// rows, 20 ms of extraction each.
func waitsJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	job.Name = "waits"
	job.Chunker = backfill.IntRange(0, 1000, 100)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		time.Sleep(20 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	return job
}

// waitsConfig retries lock waits for long with short tries.
func waitsConfig() *backfill.Config {
	rs := make([]backfill.LockRetry, 1000)
	for i := range rs {
		rs[i] = backfill.LockRetry{Timeout: 100 * time.Millisecond, Sleep: 20 * time.Millisecond}
	}
	return &backfill.Config{MaxAttempts: 1, LockRetries: rs}
}

func init() {
	// The child process of TestKillDashNineWhileWaiting.
	childProcess("BACKFILL_WAITS_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, quickFencing(*waitsConfig()))
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), waitsJob(&itemsSetup{db: db}))
		return err
	})
}

// TestKillDashNineWhileWaiting: a worker killed (SIGKILL) while its chunk
// waits behind a lock on the target (its tries time out, roll back and
// are recorded in the waits table, each in a transaction of its own)
// leaves the waits it recorded, and nothing else: the chunk is pending,
// and a resumed run completes every chunk exactly once.
func TestKillDashNineWhileWaiting(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	createItems(t, db)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BACKFILL_WAITS_CHILD="+url)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	poll := func(query string, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			var got int
			return db.Get(&got, query) == nil && got >= n
		}, 60*time.Second, 2*time.Millisecond)
	}
	poll(`SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, 2)
	locker, err := db.Connx(ctx)
	require.NoError(t, err)
	defer locker.Close()
	_, err = locker.ExecContext(ctx, `BEGIN; LOCK TABLE items IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	poll(`SELECT count(*) FROM backfill.waits`, 2)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	poll(`SELECT CASE WHEN count(*) = 0 THEN 1 ELSE 0 END FROM pg_stat_activity WHERE application_name LIKE '%backfill_test_child_%'`, 1)
	var recorded int
	require.NoError(t, db.Get(&recorded, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03'`))
	_, err = locker.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)

	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 10, "killed while a chunk waited")
	r, err := backfill.New(db, quickFencing(*waitsConfig()))
	require.NoError(t, err)
	rep, err := r.Run(ctx, waitsJob(&itemsSetup{db: db}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 10-done, rep.ChunksRun)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts, "no chunk counted twice")
	var after int
	require.NoError(t, db.Get(&after, `SELECT count(*) FROM backfill.waits WHERE sqlstate = '55P03'`))
	require.Equal(t, recorded, after, "the killed worker's waits stay recorded; the resume waited for nothing")
	var rows int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, rows)
}

// TestExtractorBugFailsTheChunk: a row no data can make valid (a wrong
// number of values; a Go type no conversion accepts for its column) is an
// extractor bug: the chunk fails at once, without retry, with an error
// wrapping ErrExtractor that names the chunk, the row, the columns
// expected and what was passed; nothing is queued or loaded. Before, the
// rows were queued as bad data and the run completed with a nil error and
// nothing loaded.
func TestExtractorBugFailsTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name   string
		row    []any
		ignore bool // the extractor ignores Write's error
		want   []string
	}{
		{"one value too many", []any{"acme", int64(5), "n", "1.00", nil, "extra"}, false,
			[]string{"wrong number of values: got 6, want 5", "tenant, id, name, amount, seen_at", "extra (string)"}},
		{"one value too few, error ignored", []any{"acme", int64(5), "n", "1.00"}, true,
			[]string{"wrong number of values: got 4, want 5"}},
		{"struct into bigint", []any{"acme", struct{ ID int }{5}, "n", "1.00", nil}, false,
			[]string{`column "id" (bigint, value 2 of 5)`, "wrong type struct { ID int }", "{5} (struct { ID int })"}},
		{"chan into bigint, error ignored", []any{"acme", make(chan int), "n", "1.00", nil}, true,
			[]string{`column "id"`, "wrong type chan int", "acme (string), (chan int), n (string)"}},
		{"func into bigint", []any{"acme", func() {}, "n", "1.00", nil}, false,
			[]string{`column "id"`, "acme (string), (func()), n (string)"}},
		{"bool into timestamptz", []any{"acme", int64(5), "n", "1.00", true}, false,
			[]string{`column "seen_at"`, "wrong type bool"}},
		{"int into text", []any{"acme", int64(5), 42, "1.00", nil}, false,
			[]string{`column "name"`, "wrong type int"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			var calls atomic.Int64
			job := s.job(1)
			job.Chunker = backfill.IntRange(0, 20, 10)
			job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				calls.Add(1)
				for id := ch.Lo; id < ch.Hi; id++ {
					row := []any{"acme", id, "x", "1.00", nil}
					if id == 13 {
						row = c.row
					}
					if err := w.Write(ctx, row...); err != nil && !c.ignore {
						return err
					}
				}
				return nil
			})
			r, err := backfill.New(s.db, &backfill.Config{RetryBackoff: 1})
			require.NoError(t, err)
			rep, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrExtractor)
			require.False(t, backfill.IsRetryable(err))
			var ce *backfill.ChunkError
			require.True(t, errors.As(err, &ce))
			require.Equal(t, "int:10/20", ce.Chunk.ID)
			msg := ce.Error()
			require.NotContains(t, msg, "0x", "no Go address")
			for _, want := range append(c.want, "int:10/20 row 4", "columns tenant, id, name, amount, seen_at") {
				require.Contains(t, msg, want)
			}
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.EqualValues(t, 2, calls.Load(), "the failed chunk is not retried")
			require.Equal(t, backfill.Counts{Read: 10, Inserted: 10}, rep.Counts, "only the first chunk")
			ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
			require.NoError(t, err)
			require.Empty(t, ex)
		})
	}
}

// TestBadDataIsNotAnExtractorBug: a value of a type the column takes that
// the column cannot hold is queued, and the chunk goes on.
func TestBadDataIsNotAnExtractorBug(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 1, 1)
	job.MaxRunRejectRate = -1
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		for _, row := range [][]any{
			{"acme", "x", "text for bigint", "1.00", nil},
			{"acme", uint64(1 << 63), "uint64 out of range", "1.00", nil},
			{"acme", 1.5, "fraction", "1.00", nil},
			{"acme", int64(1), "numeric overflow", 1e12, nil},
			{"acme", int64(2), "not a time", "1.00", "yesterday-ish"},
			{"acme", int64(3), "ok", "1.00", nil},
		} {
			if err := w.Write(ctx, row...); err != nil {
				return err
			}
		}
		return nil
	})
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 6, Inserted: 1, Rejected: 5}, rep.Counts)
}

// TestRunRejectGateIsOnByDefault: without Job.MaxRunRejectRate a run that
// rejects more than DefaultMaxRunRejectRate of its rows pauses; a rate
// can be set, and a negative one turns the gate off. A run that loaded
// none of the rows it read never completes with a nil error, even with
// the gate off: it pauses, and completes once resumed.
func TestRunRejectGateIsOnByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// rejectEvery rejects every n-th row (n 1: all of them).
	run := func(t *testing.T, s *itemsSetup, rate float64, n int64) (backfill.Report, error) {
		job := s.job(1)
		job.Chunker = backfill.IntRange(0, 100, 50)
		job.MaxRunRejectRate = rate
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			for id := ch.Lo; id < ch.Hi; id++ {
				amount := "1.00"
				if id%n == 0 {
					amount = "1e20" // numeric(10,2) overflow: queued
				}
				if err := w.Write(ctx, "acme", id, "x", amount, nil); err != nil {
					return err
				}
			}
			return nil
		})
		r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
		require.NoError(t, err)
		return r.Run(ctx, job)
	}
	t.Run("default pauses above 10%", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0, 5) // 20%
		require.ErrorIs(t, err, backfill.ErrGateFailed)
		require.Contains(t, err.Error(), "run reject rate 10/50")
		require.Equal(t, backfill.RunPaused, rep.Status)
	})
	t.Run("default passes at 10%", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0, 10)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	t.Run("overridden", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), 0.25, 5)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		rep, err := run(t, newItems(t), -1, 2)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
	for _, rate := range []float64{0, 1, -1} {
		t.Run("all rejected", func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			rep, err := run(t, s, rate, 1)
			require.ErrorIs(t, err, backfill.ErrGateFailed, "rate %v", rate)
			require.NotEqual(t, backfill.RunCompleted, rep.Status)
			require.Zero(t, rep.Counts.Inserted)
			if rate < 0 || rate >= 1 {
				require.Contains(t, err.Error(), "no row loaded: all 100 rows read were rejected")
				require.Equal(t, 2, rep.ChunksDone)
			}
			r, err := backfill.New(s.db, nil)
			require.NoError(t, err)
			job := s.job(1)
			job.Chunker = backfill.IntRange(0, 100, 50)
			job.MaxRunRejectRate = rate
			if rate == 0 {
				return // paused after the first chunk; resuming runs the second
			}
			rep, err = r.Resume(ctx, job, "tester", "the source is empty on purpose")
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, rep.Status)
		})
	}
}

// TestConcurrentStartsUnderAnyDefaultIsolation starts one job from six
// processes at once (each its own pool and Runner) on a fresh manifest
// schema, with the database's default_transaction_isolation set to each
// level: Init, StartRun and every other transaction must set their own
// level or retry 40001/40P01, so all starts converge on one batch and
// every chunk is merged exactly once. The same through PgBouncer in
// transaction mode ("pooler/"), whose server connections the six processes
// share.
func TestConcurrentStartsUnderAnyDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"direct", "pooler"} {
		for _, level := range []string{"read committed", "repeatable read", "serializable"} {
			t.Run(via+"/"+level, func(t *testing.T) {
				t.Parallel()
				concurrentStarts(t, via, level)
			})
		}
	}
}

func concurrentStarts(t *testing.T, via, level string) {
	ctx := context.Background()
	var u, adminURL string
	if via == "pooler" {
		u = pgtest.NewPoolerURL(t)
		adminURL = directURL(t, u)
	} else {
		u = pgtest.NewURL(t)
		adminURL = u
	}
	admin, err := sqlx.Open("postgres", adminURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.Exec(`CREATE TABLE items (
				tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2),
				seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
				PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	_, err = admin.Exec(fmt.Sprintf(`DO $$ BEGIN EXECUTE format('ALTER DATABASE %%I SET default_transaction_isolation = %%L', current_database(), '%s'); END $$`, level))
	require.NoError(t, err)

	s := &itemsSetup{}
	const n = 6
	dbs := make([]*sqlx.DB, n)
	for i := range n {
		dbs[i], err = sqlx.Open("postgres", u)
		require.NoError(t, err)
		db := dbs[i]
		t.Cleanup(func() { _ = db.Close() })
		var got string
		require.NoError(t, db.Get(&got, `SHOW default_transaction_isolation`))
		require.Equal(t, level, got)
	}
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		reps  = make([]backfill.Report, n)
		errs  = make([]error, n)
		logs  lockedBuffer
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := backfill.New(dbs[i], &backfill.Config{Concurrency: 2, WorkerID: fmt.Sprintf("w%d", i),
				Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			if err != nil {
				errs[i] = err
				return
			}
			reps[i], errs[i] = r.Run(ctx, s.job(1))
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			// A start after the others completed the run did
			// nothing and says so; any other error is a failure.
			require.ErrorIs(t, errs[i], backfill.ErrAlreadyCompleted, "worker %d", i)
			require.Zero(t, reps[i].ChunksRun)
		}
		total += reps[i].ChunksRun
		require.Equal(t, reps[0].BatchID, reps[i].BatchID, "worker %d", i)
	}
	require.Equal(t, 10, total)
	var batches int
	require.NoError(t, admin.Get(&batches, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, batches)
	calls := 0
	s.calls.Range(func(k, v any) bool {
		calls++
		requireExtractedOnce(t, k.(string), v.(*atomic.Int64).Load(), &logs)
		return true
	})
	require.Equal(t, 10, calls)
	var bad int
	require.NoError(t, admin.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
				OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated
				OR rows_read <> 100`))
	require.Zero(t, bad)
	var status string
	require.NoError(t, admin.Get(&status, `SELECT status FROM backfill.runs`))
	require.Equal(t, "completed", status)
	var rows int
	require.NoError(t, admin.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, rows)
}

// TestChunkRetriesSerializationFailureAndDeadlock: a chunk's transaction
// that PostgreSQL aborts with serialization_failure (40001) or
// deadlock_detected (40P01) is retried as a wait (Config.LockRetries),
// without counting toward MaxAttempts (1 here), the retry commits the
// chunk once, and each wait is recorded in the manifest. A trigger on the
// target raises each error once, counted by a sequence (which a rollback
// does not undo).
func TestChunkRetriesSerializationFailureAndDeadlock(t *testing.T) {
	t.Parallel()
	for _, code := range []pqerror.Code{"40001", "40P01"} {
		require.True(t, backfill.IsRetryable(&pq.Error{Code: code}), code)
	}
	ctx := context.Background()
	s := newItems(t)
	_, err := s.db.Exec(`CREATE SEQUENCE merges;
		CREATE FUNCTION fail_twice() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			CASE nextval('merges')
			WHEN 1 THEN RAISE EXCEPTION 'simulated serialization failure' USING ERRCODE = '40001';
			WHEN 2 THEN RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = '40P01';
			ELSE NULL;
			END CASE;
			RETURN NULL;
		END $$;
		CREATE TRIGGER fail_twice AFTER INSERT ON items FOR EACH STATEMENT EXECUTE FUNCTION fail_twice()`)
	require.NoError(t, err)
	r, err := backfill.New(s.db, &backfill.Config{MaxAttempts: 1, RetryBackoff: time.Millisecond,
		LockRetries: []backfill.LockRetry{{Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second, Sleep: time.Millisecond}, {Timeout: time.Second}}})
	require.NoError(t, err)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 200, 100)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 200, Inserted: 200}, rep.Counts)
	var merges int
	require.NoError(t, s.db.Get(&merges, `SELECT last_value FROM merges`))
	require.GreaterOrEqual(t, merges, 4, "the two failed merges ran again")
	var attempts int
	require.NoError(t, s.db.Get(&attempts, `SELECT sum(attempts) FROM backfill.chunks WHERE rows_read = 100 AND status = 'done'`))
	require.Equal(t, 2, attempts, "two chunks, each committed once; the waits are not failed attempts")
	waits, err := backfill.NewPGManifest("").Waits(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var codes []string
	for _, w := range waits {
		codes = append(codes, w.SQLState)
		require.False(t, w.Final)
	}
	require.Equal(t, []string{"40001", "40P01"}, codes, "each wait recorded")
	var rows int
	require.NoError(t, s.db.Get(&rows, `SELECT count(*) FROM items`))
	require.Equal(t, 200, rows)
}

func init() {
	// Child: extracting ahead, Concurrency 1; chunk 2's transaction hangs in
	// its validator (after merge), so chunk 3 is leased and extracted
	// ahead while it waits.
	childProcess("BACKFILL_AHEAD_KILL_CHILD", func(db *sqlx.DB) error {
		cfg := leaseConfig()
		cfg.Concurrency = 1
		r, err := backfill.New(db, cfg)
		if err != nil {
			return err
		}
		job := leaseJob(nil)
		job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
			if s.Chunk.Seq == 2 {
				select {}
			}
			return backfill.CheckResult{Check: "ok", Severity: backfill.SeverityError, Passed: true}, nil
		})}
		_, err = r.Run(context.Background(), job)
		return err
	})
}

// TestAheadKillDashNineWithAChunkAhead: kill -9 of a worker whose chunk 2
// is in its transaction and chunk 3 leased ahead; a second worker (with
// extracting ahead too) takes both over after StaleAfter, every row once.
func TestAheadKillDashNineWithAChunkAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE kx (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	killChildWhen(t, db, "BACKFILL_AHEAD_KILL_CHILD", url,
		`SELECT count(*) FROM backfill.chunks WHERE seq IN (2, 3) AND status = 'pending' AND lease_key IS NOT NULL`, 2)
	cfg := leaseConfig()
	r, err := backfill.New(db, cfg)
	require.NoError(t, err)
	start := time.Now()
	rep, err := r.Run(ctx, leaseJob(nil))
	require.NoError(t, err)
	t.Logf("took %v", time.Since(start))
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 60, Inserted: 60}, rep.Counts)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM kx`))
	require.Equal(t, 60, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.chunks WHERE lease_key IS NOT NULL`))
	require.Zero(t, n)
}

// TestPoolerSkipUnchanged: through PgBouncer (transaction mode), Concurrency
// 4 (as many chunks as the pooler's server connections), extracting
// ahead, SkipUnchanged:
// a staging refusal (bad int text) and a merge refusal (CHECK) in the
// batched savepoint paths, then a replay with one changed row.
func TestPoolerSkipUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewPoolerURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`CREATE TABLE pz (id bigint PRIMARY KEY, v text NOT NULL, n int CHECK (n >= 0))`)
	job := func(change int64, newRun bool) backfill.Job {
		return backfill.Job{Name: "pz", Chunker: backfill.IntRange(0, 100, 5), Rollback: backfill.RollbackNone, SkipUnchanged: true, NewRun: newRun, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: "pz", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					var n any = id
					switch id {
					case 7:
						n = -1 // CHECK refuses it in the merge
					case 13:
						n = "abc" // COPY refuses it in staging
					}
					v := fmt.Sprint("v", id)
					if id == change {
						v += "x"
					}
					if err := w.Write(ctx, id, v, n); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: pgtest.PoolerPoolSize})
	require.NoError(t, err)
	rep1, err := r.Run(ctx, job(-1, false))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(-1, true))
	require.NoError(t, err)
	rep3, err := r.Run(ctx, job(42, true))
	require.NoError(t, err)
	// Every chunk skips on replay but the one whose merge refused a row
	// (never recorded); the restatement also merges the changed chunk.
	require.Equal(t, []int{0, 19, 18}, []int{rep1.ChunksSkipped, rep2.ChunksSkipped, rep3.ChunksSkipped})
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM pz`))
	require.Equal(t, 98, n)
	var v string
	require.NoError(t, db.Get(&v, `SELECT v FROM pz WHERE id = 42`))
	require.Equal(t, "v42x", v)
	var ex []struct {
		B  int64  `db:"batch_id"`
		ID string `db:"chunk_id"`
		C  int    `db:"c"`
	}
	require.NoError(t, db.Select(&ex, `SELECT batch_id, chunk_id, count(*) c FROM backfill.exceptions GROUP BY 1,2 ORDER BY 1,2`))
	t.Logf("exceptions %+v", ex)
	require.Len(t, ex, 6, "each batch queues the two refused rows once")
	var sums []struct {
		B  int64 `db:"batch_id"`
		Rd int64 `db:"rd"`
		Rj int64 `db:"rj"`
	}
	require.NoError(t, db.Select(&sums, `SELECT batch_id, sum(rows_read) rd, sum(rows_rejected) rj FROM backfill.chunks GROUP BY 1 ORDER BY 1`))
	t.Logf("sums %+v", sums)
	var ns []string
	require.NoError(t, db.Select(&ns, `SELECT chunk_id FROM backfill.chunks WHERE batch_id = 2 AND NOT skipped`))
	require.Equal(t, []string{"int:5/10"}, ns, "chunks merged in the unchanged replay")
	for _, s := range sums {
		require.Equal(t, int64(100), s.Rd)
		require.Equal(t, int64(2), s.Rj)
	}
}

// Through PgBouncer in transaction pooling mode (pgtest.NewPoolerURL: a
// pool of a few server connections shared by all clients, an ordinary
// connection string without binary_parameters). A parameterised statement
// that lib/pq sends outside a transaction takes two round trips, between
// which the pooler may hand the server connection to another client: the
// statements of clients get mixed up ("bind message has 13 result formats
// but query has 1 columns", a false "target has no unique index"). Every
// statement of the library with parameters must run in a transaction, and
// none may rely on session state.

// pooledItems is itemsSetup on a database reached through the pooler; db
// is a direct connection to the same database, for the test's own checks.
func pooledItems(t *testing.T) (s *itemsSetup, pooledURL string) {
	t.Helper()
	pooledURL = pgtest.NewPoolerURL(t)
	db, err := sqlx.Open("postgres", pooledURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE items (
		tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2),
		seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
	return &itemsSetup{db: db}, pooledURL
}

// directURL is the URL of the database of pooled (a URL through the
// pooler) on the server itself.
func directURL(t *testing.T, pooled string) string {
	t.Helper()
	pu, err := neturl.Parse(pooled)
	require.NoError(t, err)
	au, err := neturl.Parse(pgtest.AdminURL())
	require.NoError(t, err)
	pu.Host = au.Host
	return pu.String()
}

// TestThroughPoolerConcurrentRunners: four processes (each its own pool
// of client connections and Runner, Concurrency 3) run one job, with a
// validator, through the pooler; then a second version of the job is run
// and validated, and rolled back. Every chunk is merged exactly once, the
// manifest balances and nothing fails.
func TestThroughPoolerConcurrentRunners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, u := pooledItems(t)
	const n = 4
	var (
		wg   sync.WaitGroup
		reps = make([]backfill.Report, n)
		errs = make([]error, n)
	)
	job := s.job(1)
	job.Validators = []backfill.Validator{backfill.DuplicateKeys{}, backfill.Completeness{CompareContent: true},
		backfill.ReplayChangesNothing{}, backfill.Aggregates{Measures: []backfill.Measure{{Column: "amount"}}}}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sqlx.Open("postgres", u)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			r, err := backfill.New(db, &backfill.Config{Concurrency: 3, WorkerID: fmt.Sprintf("w%d", i)})
			if err != nil {
				errs[i] = err
				return
			}
			reps[i], errs[i] = r.Run(ctx, job)
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], backfill.ErrAlreadyCompleted, "worker %d", i)
			require.Zero(t, reps[i].ChunksRun)
		}
		total += reps[i].ChunksRun
		require.Equal(t, reps[0].BatchID, reps[i].BatchID, "worker %d", i)
	}
	require.Equal(t, 10, total)
	// Every chunk was extracted; one extracted again (a retry, or a lease
	// taken over from a runner slowed by the machine) is allowed by the
	// contract, so what must hold once per chunk is its merge: ten chunks
	// run across the runners and each chunk's manifest row balanced.
	extracted := 0
	s.calls.Range(func(k, v any) bool {
		require.GreaterOrEqual(t, v.(*atomic.Int64).Load(), int64(1), k)
		extracted++
		return true
	})
	require.Equal(t, 10, extracted)
	var bad int
	require.NoError(t, s.db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
		OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated OR rows_read <> 100`))
	require.Zero(t, bad)
	var inserted int
	require.NoError(t, s.db.Get(&inserted, `SELECT coalesce(sum(rows_inserted), 0) FROM backfill.chunks`))
	require.Equal(t, 1000, inserted, "every row inserted once across the runners")

	// Version 2, validated, then rolled back, still through the pooler.
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 4})
	require.NoError(t, err)
	job2 := s.job(2)
	job2.Validators = job.Validators
	job2.NewRun = true
	rep2, err := r.Run(ctx, job2)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep2.Status)
	var changed int
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Equal(t, 100, changed)
	for _, batch := range []int64{reps[0].BatchID, rep2.BatchID} {
		vs, err := backfill.NewPGManifest("").Validations(ctx, s.db, batch)
		require.NoError(t, err)
		require.Len(t, vs, 4*10)
		for _, v := range vs {
			require.True(t, v.Passed, "%s %s: expected %s, got %s", v.ChunkID, v.Check, v.Expected, v.Actual)
		}
	}
	_, err = r.Rollback(ctx, job2, backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "test"})
	require.NoError(t, err)
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Zero(t, changed)
	// No lock outlives the transaction that took it: the pooler would
	// leave it on a server connection that other clients then use.
	var locks int
	require.NoError(t, s.db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`))
	require.Zero(t, locks)
}

// pooledFencing is quickFencing for workers behind the test pooler, with
// more slack: StaleAfter 5 s, heartbeats every 250 ms. A heartbeat there
// waits for one of the pooler's few server connections
// (pgtest.PoolerPoolSize), which the chunks' transactions hold, for
// longer on a loaded machine.
func pooledFencing(cfg backfill.Config) *backfill.Config {
	cfg.HeartbeatInterval, cfg.StaleAfter = 250*time.Millisecond, 5*time.Second
	return &cfg
}

// TestThroughPoolerKillDashNine is TestKillDashNine through the pooler:
// the child process runs the crash job with the pooler's URL and is killed
// with SIGKILL twice, at chunk boundaries it does not know of; the resumed
// run completes with every chunk counted once and the target equal to an
// uninterrupted run's.
func TestThroughPoolerKillDashNine(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	pooled := pgtest.NewPoolerURL(t)
	// The test's own checks go to the server directly.
	db := sqlx.MustOpen("postgres", directURL(t, pooled))
	t.Cleanup(func() { db.Close() })
	createItems(t, db)

	for _, doneBeforeKill := range []int{4, 15} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BACKFILL_CRASH_POOLED_CHILD="+pooled)
		require.NoError(t, cmd.Start())
		for deadline := time.Now().Add(60 * time.Second); ; {
			var got int
			if err := db.Get(&got, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`); err == nil && got >= doneBeforeKill {
				break
			}
			require.True(t, time.Now().Before(deadline), "child made no progress")
			time.Sleep(2 * time.Millisecond)
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		// The pooler's server connections outlive the child: wait until
		// none of them works on the database (a COMMIT sent before the
		// kill finishes), so that what the test reads is what the crash
		// left.
		for deadline := time.Now().Add(30 * time.Second); ; {
			var busy int
			require.NoError(t, db.Get(&busy, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND state NOT IN ('idle')`))
			if busy == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "the child's transactions did not end")
			time.Sleep(2 * time.Millisecond)
		}
	}
	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 40, "the child was killed before the end")

	pdb := sqlx.MustOpen("postgres", pooled)
	t.Cleanup(func() { pdb.Close() })
	r, err := backfill.New(pdb, pooledFencing(backfill.Config{Concurrency: 3}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, crashJob(&itemsSetup{db: pdb}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 40-done, rep.ChunksRun, "resume ran only the chunks not done")
	require.Equal(t, backfill.Counts{Read: 10000, Inserted: 10000}, rep.Counts, "no chunk counted twice")
	var bad int
	require.NoError(t, db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE status <> 'done'
		OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated OR rows_read <> 250`))
	require.Zero(t, bad)
	// An uninterrupted run writes these rows (itemsSetup's generator).
	var mismatched int
	require.NoError(t, db.Get(&mismatched, `SELECT count(*) FROM generate_series(0, 9999) g(id)
		FULL JOIN items i ON i.id = g.id AND i.tenant = 'acme'
		WHERE i.id IS NULL OR g.id IS NULL OR i.name <> 'item-' || g.id OR i.amount <> (g.id::text || '.' || lpad((g.id % 100)::text, 2, '0'))::numeric`))
	require.Zero(t, mismatched)
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, runs, "every restart resumed the same batch")
}

// TestThroughPoolerPublishModes runs each publish mode through the
// pooler with two processes on one job, then rolls the batch back: the
// view switch, the partition swap and the publish at the end take their
// locks and settings in transactions of their own.
func TestThroughPoolerPublishModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runTwo := func(t *testing.T, u string, job backfill.Job) int64 {
		t.Helper()
		var (
			wg      sync.WaitGroup
			batches [2]int64
			errs    [2]error
		)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				db, err := sqlx.Open("postgres", u)
				if err != nil {
					errs[i] = err
					return
				}
				defer db.Close()
				r, err := backfill.New(db, &backfill.Config{Concurrency: 3, WorkerID: fmt.Sprintf("w%d", i)})
				if err != nil {
					errs[i] = err
					return
				}
				rep, err := r.Run(ctx, job)
				batches[i], errs[i] = rep.BatchID, err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "worker %d", i)
			}
		}
		require.Equal(t, batches[0], batches[1])
		return batches[0]
	}
	rollBack := func(t *testing.T, db *sqlx.DB, job backfill.Job, batch int64) {
		t.Helper()
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "t", Why: "test"})
		require.NoError(t, err)
		require.Equal(t, backfill.RunRolledBack, rb.Status)
	}
	balanced := func(t *testing.T, db *sqlx.DB, batch int64) {
		t.Helper()
		var bad int
		require.NoError(t, db.Get(&bad, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND (status <> 'done'
			OR rows_read <> rows_inserted + rows_updated + rows_unchanged + rows_rejected + rows_deduplicated)`, batch))
		require.Zero(t, bad)
	}

	t.Run("versioned_view", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
		require.NoError(t, err)
		batch := runTwo(t, u, viewJob(false))
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`))
		require.Equal(t, fmt.Sprintf("400/%d", 3*399*400/2), s)
		rollBack(t, db, viewJob(false), batch)
	})
	t.Run("partition_swap", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE sales (day timestamptz NOT NULL, id int NOT NULL, amount int NOT NULL, PRIMARY KEY (day, id))
				PARTITION BY RANGE (day);
			CREATE TABLE sales_d1 PARTITION OF sales FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');
			CREATE TABLE sales_d2 PARTITION OF sales FOR VALUES FROM ('2024-01-02 00:00Z') TO ('2024-01-03 00:00Z');
			INSERT INTO sales SELECT '2024-01-01 00:00Z'::timestamptz + g * interval '1 minute', g, 1 FROM generate_series(0, 99) g;`)
		require.NoError(t, err)
		job := backfill.Job{Name: "sales", ChunkColumn: "day",
			Chunker: backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 3, 0, 0, 0, 0, time.UTC), time.UTC),
			Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for i := range 150 {
					if err := w.Write(ctx, c.Start.Add(time.Duration(i)*time.Minute), int64(i), int64(2)); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "sales", Key: []string{"day", "id"}, Columns: []string{"day", "id", "amount"}}}
		batch := runTwo(t, u, job)
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM sales`))
		require.Equal(t, "300/600", s)
		rollBack(t, db, job, batch)
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM sales`))
		require.Equal(t, "100/100", s, "the old partitions are back")
	})
	t.Run("at_end", func(t *testing.T) {
		t.Parallel()
		u := pgtest.NewPoolerURL(t)
		db := sqlx.MustOpen("postgres", u)
		t.Cleanup(func() { db.Close() })
		_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint);
			INSERT INTO orders (id, amount) SELECT g, 0 FROM generate_series(0, 9) g;`)
		require.NoError(t, err)
		batch := runTwo(t, u, atEndJob(false))
		balanced(t, db, batch)
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || count(*) FILTER (WHERE amount = id * 3) FROM orders`))
		require.Equal(t, "393/392", s, "8 rejected rows not loaded; row 7, there before, kept at 0")
		require.Len(t, exceptionsOf(t, db, batch), 8)
		rollBack(t, db, atEndJob(false), batch)
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders`))
		require.Equal(t, "10/0", s)
	})
}

// TestStatementPoolerIsNamed: a pooler in statement mode refuses
// transactions by dropping the connection, and lib/pq loses its message;
// the library's error says what to set.
func TestStatementPoolerIsNamed(t *testing.T) {
	t.Parallel()
	db := sqlx.MustOpen("postgres", pgtest.NewStatementPoolerURL(t))
	t.Cleanup(func() { db.Close() })
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), (&itemsSetup{}).job(1))
	require.ErrorIs(t, err, driver.ErrBadConn)
	require.ErrorContains(t, err, "pool_mode = transaction")
}

type cycleNode struct {
	Name string
	Next *cycleNode
	Any  any
}

// TestRejectStoresAnyValue: whatever an extractor passes to Reject, or
// writes into a jsonb column, is stored in the exception queue: a map or
// slice that contains itself, a pointer cycle, a value nested deeper than
// jsonb takes, a huge value. Before, fmt and the JSON walk recursed
// forever on the self-referencing map ("fatal error: stack overflow",
// which no recover catches).
func TestRejectStoresAnyValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE docs (id bigint PRIMARY KEY, doc jsonb)`)
	require.NoError(t, err)

	selfMap := map[string]any{"name": "loop"}
	selfMap["self"] = selfMap
	selfSlice := []any{"a", nil}
	selfSlice[1] = selfSlice
	node := &cycleNode{Name: "n"}
	node.Next = node
	viaAny := &cycleNode{Name: "m"}
	viaAny.Any = map[string]any{"back": viaAny, "list": []any{viaAny}}
	deep := any("bottom")
	for range 10_000 {
		deep = []any{deep}
	}
	deepMap := map[string]any{}
	for m, i := deepMap, 0; i < 5000; i++ {
		next := map[string]any{}
		m["k"] = next
		m = next
	}
	huge := make([]any, 200_000)
	for i := range huge {
		huge[i] = i
	}
	hugeMap := map[int]string{}
	for i := range 200_000 {
		hugeMap[i] = "v"
	}
	wideMap := map[string]any{}
	for i := range 100_000 {
		wideMap[strconv.Itoa(i)] = i
	}
	values := []any{selfMap, selfSlice, node, *node, viaAny, deep, deepMap, huge, hugeMap, strings.Repeat("é", 600_000), wideMap}

	r, err := backfill.New(db, &backfill.Config{MaxRejectsPerChunk: -1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, backfill.Job{
		Name: "raw", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "docs", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i, v := range values {
				if err := w.Reject(ctx, v, "doc", "odd value"); err != nil {
					return err
				}
				// The same value written into a jsonb column: what JSON
				// cannot encode (a cycle) is queued as the row's raw.
				if err := w.Write(ctx, int64(i), v); err != nil {
					return err
				}
			}
			return w.Write(ctx, int64(-1), map[string]any{"fine": true})
		}),
	})
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.EqualValues(t, 2*len(values)+1, rep.Counts.Read)
	require.EqualValues(t, rep.Counts.Read, rep.Counts.Rejected+rep.Counts.Inserted)
	require.GreaterOrEqual(t, rep.Counts.Rejected, int64(len(values)+2), "every Reject, and at least the cyclic values written")

	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, int(rep.Counts.Rejected))
	byRow := map[int64]backfill.Exception{}
	for _, e := range ex {
		require.True(t, json.Valid(e.Raw), "row %d", e.Row)
		require.LessOrEqual(t, len(e.Raw), 70<<10, "row %d: raw is capped (jsonb adds spaces)", e.Row)
		require.LessOrEqual(t, len(e.Value), 1100, "row %d: value is capped", e.Row)
		byRow[e.Row] = e
	}
	// Rejected values (odd rows) keep their content up to the cycle.
	var m map[string]any
	require.NoError(t, json.Unmarshal(byRow[1].Raw, &m))
	require.Equal(t, "loop", m["name"])
	require.Equal(t, "<cycle>", m["self"])
	var s []any
	require.NoError(t, json.Unmarshal(byRow[3].Raw, &s))
	require.Equal(t, []any{"a", "<cycle>"}, s)
	for _, row := range []int64{5, 7, 9} {
		var text string
		require.NoError(t, json.Unmarshal(byRow[row].Raw, &text), "row %d: %s", row, byRow[row].Raw)
		require.Contains(t, text, "{", "row %d: stored as its %%v text", row)
	}
	require.Contains(t, string(byRow[11].Raw), "<too deep>")
	require.Contains(t, string(byRow[13].Raw), "<too deep>")
	// The self-referencing map written into the jsonb column is queued
	// with its value shown and the cycle marked.
	w := byRow[2]
	require.Equal(t, "doc", w.Column)
	require.Contains(t, w.Value, "<cycle>")
	require.Contains(t, w.Reason, "json")
}

// TestAbandonedRunStopsWriting: a worker of a run that a newer run
// abandoned (Job.NewRun, code v2) must not write over the newer run.
func TestAbandonedRunStopsWriting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	started := make(chan struct{})
	var once atomic.Bool
	slow := s.job(1)
	slow.Chunker = backfill.IntRange(0, 400, 10)
	inner := slow.Extractor
	slow.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if once.CompareAndSwap(false, true) {
			close(started)
		}
		time.Sleep(5 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	r1, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, WorkerID: "old"})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := r1.Run(ctx, slow)
		done <- err
	}()
	<-started
	fresh := s.job(2) // other names for every tenth id
	fresh.Chunker = slow.Chunker
	fresh.CodeVersion = "v2"
	fresh.NewRun = true
	r2, err := backfill.New(s.db, &backfill.Config{WorkerID: "new"})
	require.NoError(t, err)
	rep, err := r2.Run(ctx, fresh)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.ErrorIs(t, <-done, backfill.ErrRunAbandoned)

	var stale int
	require.NoError(t, s.db.Get(&stale, `SELECT count(*) FROM items WHERE id % 10 = 0 AND name NOT LIKE 'v2-%'`))
	require.Zero(t, stale, "no row of the abandoned run written after the new run")
	var late int
	require.NoError(t, s.db.Get(&late, `SELECT count(*) FROM backfill.chunks c JOIN backfill.chunks n ON n.chunk_id = c.chunk_id
		WHERE c.batch_id = 1 AND n.batch_id = $1 AND c.status = 'done' AND c.finished_at > n.started_at`, rep.BatchID))
	require.Zero(t, late, "the old run completed no chunk after the new run started it")
}

func TestTriggerThatDropsRowsFailsTheChunk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text);
		CREATE FUNCTION drop_odd() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN IF NEW.id % 2 = 1 THEN RETURN NULL; END IF; RETURN NEW; END $$;
		CREATE TRIGGER drop_odd BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION drop_odd();`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(context.Background(), backfill.Job{Name: "t", Chunker: backfill.IntRange(0, 20, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for i := c.Lo; i < c.Hi; i++ {
				if err := w.Write(ctx, i, "x"); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "t", Key: []string{"id"}}})
	require.ErrorIs(t, err, backfill.ErrAccounting)
	require.Contains(t, err.Error(), "trigger")
}

func TestExtractorPanicFailsOnlyTheChunk(t *testing.T) {
	t.Parallel()
	s := newItems(t)
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 300 {
			var m []int
			_ = m[c.Lo] // index out of range: a bug in the extractor
		}
		return inner.Extract(ctx, c, w)
	})
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	require.ErrorIs(t, err, backfill.ErrExtractorPanic)
	require.Contains(t, err.Error(), "index out of range")
	require.False(t, backfill.IsRetryable(err))
	require.Equal(t, 3, rep.ChunksDone)
	cs := manifestChunks(t, s.db, rep.BatchID)
	require.Equal(t, 1, cs[3].Attempts, "a panic is not retried")
}

// TestOtherUniqueViolationsAreNotRetried: a row that violates a unique
// constraint other than the business key's is refused (queued, the rest
// of the chunk merges), never retried; when no refusal is allowed
// (MaxMergeRefusals < 0) the chunk fails at once, naming the row and the
// constraint, without a retry.
func TestOtherUniqueViolationsAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, -1} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			// The key index has INCLUDE columns (still the key); email is another unique constraint.
			_, err := db.Exec(`CREATE TABLE users (id int NOT NULL, email text UNIQUE, name text);
				CREATE UNIQUE INDEX users_key ON users (id) INCLUDE (name);`)
			require.NoError(t, err)
			var calls atomic.Int32
			r, err := backfill.New(db, &backfill.Config{MaxAttempts: 5, RetryBackoff: time.Millisecond, MaxMergeRefusals: limit})
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), backfill.Job{Name: "users", Chunker: backfill.List("a"),
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					calls.Add(1)
					for i := range 3 {
						if err := w.Write(ctx, int64(i), "same@example.com", fmt.Sprint(i)); err != nil {
							return err
						}
					}
					return nil
				}),
				Rollback:         backfill.RollbackNone,
				MaxRunRejectRate: -1, // two of three rows are refused on purpose
				Target:           backfill.Target{Table: "users", Key: []string{"id"}}})
			require.Equal(t, int32(1), calls.Load(), "not retried")
			if limit < 0 {
				var pe *backfill.PartialError
				require.True(t, errors.As(err, &pe), "%v", err)
				require.ErrorIs(t, err, backfill.ErrTooManyRejects)
				require.Contains(t, err.Error(), `row 2 key (1) refused by the target: duplicate key value violates unique constraint "users_email_key" (SQLSTATE 23505)`)
				return
			}
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 3, Inserted: 1, Rejected: 2}, rep.Counts)
			var ids []int
			require.NoError(t, db.Select(&ids, `SELECT id FROM users`))
			require.Equal(t, []int{0}, ids)
		})
	}
}

func TestTypesWithoutEqualityReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TYPE pair AS (doc json, n int);
		CREATE TABLE docs (id int PRIMARY KEY, tags json[], p pair, pt point)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(newRun bool, tag string) backfill.Job {
		return backfill.Job{Name: "docs", NewRun: newRun, Chunker: backfill.List("a"),
			Extractor: rowsFunc([]any{int64(1), `{"{\"a\": 1}","` + tag + `"}`, `("{\"x\": 2}",3)`, "(1,2)"}),
			Rollback:  backfill.RollbackNone,
			Target:    backfill.Target{Table: "docs", Key: []string{"id"}}}
	}
	_, err = r.Run(ctx, job(false, "{}"))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job(true, "{}"))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Unchanged: 1}, rep.Counts)
	rep, err = r.Run(ctx, job(true, "[]"))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Updated: 1}, rep.Counts)
}

func TestNondeterministicCollationKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE fruit (name text COLLATE ci PRIMARY KEY, n int)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), backfill.Job{Name: "fruit", Chunker: backfill.List("a"),
		Extractor: rowsFunc([]any{"Apple", int64(1)}, []any{"APPLE", int64(2)}, []any{"pear", int64(3)}),
		Rollback:  backfill.RollbackNone,
		Target:    backfill.Target{Table: "fruit", Key: []string{"name"}}})
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 3, Inserted: 2, Deduplicated: 1}, rep.Counts, "Apple and APPLE are one key under the collation")
}

// leaseJob loads ids [0, 60) into table kx in chunks of 10; block, if
// not nil, is called by the extractor after a chunk's rows.
func leaseJob(block func(c backfill.Chunk)) backfill.Job {
	return backfill.Job{
		Name:    "kx",
		Chunker: backfill.IntRange(0, 60, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			if block != nil {
				block(c)
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: "kx", Key: []string{"id"}},
	}
}

func leaseConfig() *backfill.Config {
	return &backfill.Config{Concurrency: 2, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second}
}

func init() {
	// The child of TestKillDashNineWhileExtracting: chunk 2's extraction
	// never ends.
	childProcess("BACKFILL_LEASE_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, leaseConfig())
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), leaseJob(func(c backfill.Chunk) {
			if c.Seq == 2 {
				select {}
			}
		}))
		return err
	})
}

// TestKillDashNineWhileExtracting kills a worker with SIGKILL while it
// extracts a chunk it leased (outside any transaction): another worker
// takes the lease over once the killed worker's heartbeat is stale, and
// every chunk is merged exactly once, its rows balanced.
func TestKillDashNineWhileExtracting(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE kx (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	killChildWhen(t, db, "BACKFILL_LEASE_CHILD", url,
		`SELECT count(*) FROM backfill.chunks WHERE seq = 2 AND status = 'pending' AND lease_key IS NOT NULL`, 1)
	var before struct {
		Key   string `db:"lease_key"`
		Epoch int64  `db:"lease_epoch"`
	}
	require.NoError(t, db.Get(&before, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))

	r, err := backfill.New(db, leaseConfig())
	require.NoError(t, err)
	rep, err := r.Run(ctx, leaseJob(nil))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 6, rep.ChunksDone)
	require.Equal(t, backfill.Counts{Read: 60, Inserted: 60}, rep.Counts, "every chunk merged once")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM kx`))
	require.Equal(t, 60, n)
	var after struct {
		Key   *string `db:"lease_key"`
		Epoch int64   `db:"lease_epoch"`
	}
	require.NoError(t, db.Get(&after, `SELECT lease_key, lease_epoch FROM backfill.chunks WHERE seq = 2`))
	require.Nil(t, after.Key, "the checkpoint cleared the lease")
	require.Equal(t, before.Epoch+1, after.Epoch, "taken over from the killed worker %s", before.Key)
}

// planKillChunks is the number of chunks of the plan TestKillDashNineWhilePlanning
// kills the planning of.
const planKillChunks = 50_000

// stallingStream is IntRange(0, planKillChunks, 1) whose chunks stop
// coming, for a minute, after stallAt chunks of its stallOn-th ChunkSeq
// (0: never).
type stallingStream struct {
	backfill.ChunkStreamer
	stallOn, stallAt int32
	calls            atomic.Int32
}

func newStallingStream(stallOn, stallAt int32) *stallingStream {
	return &stallingStream{ChunkStreamer: backfill.IntRange(0, planKillChunks, 1).(backfill.ChunkStreamer), stallOn: stallOn, stallAt: stallAt}
}

func (s *stallingStream) ChunkSeq(ctx context.Context) iter.Seq2[backfill.Chunk, error] {
	call := s.calls.Add(1)
	return func(yield func(backfill.Chunk, error) bool) {
		for c, err := range s.ChunkStreamer.ChunkSeq(ctx) {
			if call == s.stallOn && int32(c.Seq) == s.stallAt {
				time.Sleep(time.Minute)
			}
			if !yield(c, err) {
				return
			}
		}
	}
}

func planKillJob(ch backfill.Chunker, ex backfill.Extractor) backfill.Job {
	return backfill.Job{Name: "plan_kill", Chunker: ch, Rollback: backfill.RollbackNone, Extractor: ex,
		Target: backfill.Target{Table: "plan_kill", Key: []string{"id"}}}
}

func init() {
	// The child process of TestKillDashNineWhilePlanning: plan the job;
	// the chunks stop coming part way through the insert of its chunk
	// rows (the Runner's third pass: checks, fingerprint, insert), and
	// the parent kills it.
	childProcess("BACKFILL_PLAN_KILL_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, nil)
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), planKillJob(newStallingStream(3, 30_000),
			backfill.ExtractorFunc(func(context.Context, backfill.Chunk, backfill.RowWriter) error { return nil })))
		return err
	})
}

// TestKillDashNineWhilePlanning: a process killed (SIGKILL) while it
// inserts a long plan's chunk rows, 30,000 of 50,000 sent, leaves no run
// and no chunk row: the chunks are inserted in the transaction that
// creates the run. The same job then plans whole.
func TestKillDashNineWhilePlanning(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE plan_kill (id bigint PRIMARY KEY)`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, db))
	// The child's COPY of the chunk rows has processed 20,000 rows (it
	// stalls at 30,000; lib/pq sends rows in 64 KiB messages).
	killChildWhen(t, db, "BACKFILL_PLAN_KILL_CHILD", url,
		`SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy WHERE relid = 'backfill.chunks'::regclass`, 20_000)
	var runs, chunks int
	require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM backfill.runs), (SELECT count(*) FROM backfill.chunks)`).Scan(&runs, &chunks))
	require.Equal(t, [2]int{0, 0}, [2]int{runs, chunks}, "runs and chunks after the kill")

	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = r.Run(rctx, planKillJob(newStallingStream(0, 0), backfill.ExtractorFunc(func(context.Context, backfill.Chunk, backfill.RowWriter) error {
		cancel() // planned: one chunk is enough
		return nil
	})))
	require.True(t, errors.Is(err, context.Canceled), "run: %v", err)
	require.NoError(t, db.QueryRow(`SELECT (SELECT count(*) FROM backfill.runs), (SELECT count(*) FROM backfill.chunks)`).Scan(&runs, &chunks))
	require.Equal(t, [2]int{1, planKillChunks}, [2]int{runs, chunks}, "runs and chunks of the plan made again")
}
