package backfill_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// refusedSetup is a target whose columns take values the row writer
// passes as text for PostgreSQL to read: an enum, a domain with a CHECK,
// inet, a range and an array.
func refusedSetup(t *testing.T) *sqlx.DB {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(`
		CREATE TYPE mood AS ENUM ('sad', 'ok');
		CREATE DOMAIN posint AS int CHECK (VALUE > 0);
		CREATE TABLE t (id int PRIMARY KEY, m mood, p posint, ip inet, r int4range, a int[])`)
	require.NoError(t, err)
	return db
}

// refusedRows returns 40 rows, ids 1..40, with a value PostgreSQL refuses
// in the rows of bad (id: column), and an extractor-level rejection at id
// 5 (a string for the int key), which shifts staged lines against rows.
func refusedRows(bad map[int]string) [][]any {
	var rows [][]any
	for id := 1; id <= 40; id++ {
		r := []any{id, "ok", 1, "10.0.0.1", "[1,5)", "{1,2}"}
		switch bad[id] {
		case "m":
			r[1] = "happy"
		case "p":
			r[2] = -3
		case "ip":
			r[3] = "10.0.0.x"
		case "r":
			r[4] = "[5,1)"
		case "a":
			r[5] = "{1,"
		}
		if id == 5 {
			r[0] = "five"
		}
		rows = append(rows, r)
	}
	return rows
}

func refusedJob(rows [][]any) backfill.Job {
	return backfill.Job{Name: "refused", Chunker: backfill.List("file-1"), Extractor: rowsFunc(rows...),
		Target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "m", "p", "ip", "r", "a"}}, Rollback: backfill.RollbackNone,
		MaxRunRejectRate: -1} // the rejects are what the tests are about
}

// TestStagingIsolatesRefusedRows: values that only PostgreSQL's input
// functions can judge (an enum label, a domain's CHECK, inet, a range, an
// array) go to the exception queue with their row, column, value and
// PostgreSQL's message, and every other row of the chunk loads; the
// chunk's counts balance.
func TestStagingIsolatesRefusedRows(t *testing.T) {
	t.Parallel()
	for _, publish := range []backfill.PublishMode{backfill.PublishPerChunk, backfill.PublishAtEnd} {
		t.Run(string(cmpOr(publish, "per_chunk")), func(t *testing.T) {
			t.Parallel()
			db := refusedSetup(t)
			bad := map[int]string{1: "m", 6: "p", 17: "ip", 18: "r", 40: "a"}
			job := refusedJob(refusedRows(bad))
			job.Publish.Mode = publish
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, rep.Status)
			require.Equal(t, backfill.Counts{Read: 40, Inserted: 34, Rejected: 6}, rep.Counts)

			var got []string
			for _, e := range exceptionsOf(t, db, rep.BatchID) {
				got = append(got, fmt.Sprintf("%d %s=%s: %s", e.Row, e.Column, e.Value, e.Reason))
			}
			slices.Sort(got)
			require.Equal(t, []string{
				`1 m=happy: invalid input value for enum mood: "happy" (SQLSTATE 22P02)`,
				`17 ip=10.0.0.x: invalid input syntax for type inet: "10.0.0.x" (SQLSTATE 22P02)`,
				`18 r=[5,1): range lower bound must be less than or equal to range upper bound (SQLSTATE 22000): value [5,1)`,
				`40 a={1,: malformed array literal: "{1," (SQLSTATE 22P02)`,
				`5 id=five: invalid input syntax for type integer: value five`,
				`6 p=-3: value for domain posint violates check constraint "posint_check" (SQLSTATE 23514): value -3`,
			}, got)
			var ids []int
			require.NoError(t, db.Select(&ids, `SELECT id FROM t ORDER BY id`))
			var want []int
			for id := 1; id <= 40; id++ {
				if bad[id] == "" && id != 5 {
					want = append(want, id)
				}
			}
			require.Equal(t, want, ids)
		})
	}
}

// TestStagingRejectsAreBounded: past Config.MaxStagingRejects refused
// rows the chunk fails, naming the chunk, row, column and value, and
// nothing of it is loaded; with a negative limit it fails at the first
// refused row, naming it too.
func TestStagingRejectsAreBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit int
		want  string
	}{
		{2, `backfill: stage public.t: row 18 column "r" value "[5,1)" refused: range lower bound must be less than or equal to range upper bound (SQLSTATE 22000); 2 values of this chunk were refused already`},
		{-1, `chunk 0 list:file-1 (attempt 1): backfill: stage public.t: row 1 column "m" value "happy" refused: invalid input value for enum mood: "happy" (SQLSTATE 22P02)`},
	} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			t.Parallel()
			db := refusedSetup(t)
			r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: tc.limit, MaxAttempts: 1})
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), refusedJob(refusedRows(map[int]string{1: "m", 6: "p", 18: "r", 40: "a"})))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			if tc.limit > 0 {
				require.ErrorIs(t, err, backfill.ErrTooManyRejects)
			}
			require.Equal(t, backfill.RunFailed, rep.Status)
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t`))
			require.Zero(t, n, "a failed chunk loads nothing")
		})
	}
}

// TestStagingRejectsFollowTheValue: an extractor that returns its rows in
// another order on every extraction still gets the refused row, and only
// it, rejected: a queued row is matched by position and value.
func TestStagingRejectsFollowTheValue(t *testing.T) {
	t.Parallel()
	db := refusedSetup(t)
	rows := refusedRows(nil)[5:] // ids 6..40
	rows[2][1] = "happy"         // id 8
	var calls atomic.Int32
	job := refusedJob(nil)
	job.Extractor = flipping(rows, &calls)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 35, Inserted: 34, Rejected: 1}, rep.Counts)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 1)
	require.Equal(t, "happy", ex[0].Value)
	require.Contains(t, string(ex[0].Raw), `"id": 8`)
	var m string
	require.NoError(t, db.Get(&m, `SELECT string_agg(DISTINCT m::text, ',') FROM t`))
	require.Equal(t, "ok", m)
	// The restaging replays the chunk's spool (short transactions): the extractor runs once.
	require.Equal(t, int32(1), calls.Load())
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// TestStagingRejectsFollowTheValueOfAnyType: the refused row is found
// again by its value whatever the value's Go type (an int into a domain
// with a CHECK, NULL into a domain with NOT NULL) and whatever the column
// is called (a colon in its name), when the extractor rotates its rows
// between extractions: exactly the bad row is queued.
func TestStagingRejectsFollowTheValueOfAnyType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, column string
		bad          any
		reason       string
	}{
		{"int into CHECK domain", "p", int64(-3), `value for domain posint violates check constraint "posint_check" (SQLSTATE 23514): value -3`},
		{"NULL into NOT NULL domain", "nn", nil, `domain nnint does not allow null values (SQLSTATE 23502)`},
		{"colon in column name", "a:b", "happy", `invalid input value for enum mood: "happy" (SQLSTATE 22P02)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			db.MustExec(`CREATE TYPE mood AS ENUM ('sad', 'ok');
				CREATE DOMAIN posint AS int CHECK (VALUE > 0);
				CREATE DOMAIN nnint AS int NOT NULL;
				CREATE TABLE t (id int PRIMARY KEY, p posint, nn nnint, "a:b" mood)`)
			var rows [][]any
			for id := int64(1); id <= 30; id++ {
				rows = append(rows, []any{id, id, id, "ok"})
			}
			col := map[string]int{"p": 1, "nn": 2, "a:b": 3}[tc.column]
			rows[16][col] = tc.bad // id 17
			var calls atomic.Int32
			job := backfill.Job{Name: "t", Chunker: backfill.List("f"), Rollback: backfill.RollbackNone,
				Target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "p", "nn", "a:b"}},
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					k := int(calls.Add(1)) * 7 % len(rows) // another rotation each time
					for _, r := range append(slices.Clone(rows[k:]), rows[:k]...) {
						if err := w.Write(ctx, r...); err != nil {
							return err
						}
					}
					return nil
				})}
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 30, Inserted: 29, Rejected: 1}, rep.Counts)
			ex := exceptionsOf(t, db, rep.BatchID)
			require.Len(t, ex, 1)
			require.Equal(t, []string{tc.column, tc.reason}, []string{ex[0].Column, ex[0].Reason})
			require.Contains(t, string(ex[0].Raw), `"id": 17`)
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t WHERE id <> 17`))
			require.Equal(t, 29, n)
		})
	}
}

// TestStagingRefusedValueIsQueuedEverywhereAtOnce: a value PostgreSQL
// refuses is refused in every row that holds it, so all those rows are
// queued after a single restaging: a label missing from an enum costs one
// more extraction, not one per row.
func TestStagingRefusedValueIsQueuedEverywhereAtOnce(t *testing.T) {
	t.Parallel()
	db := refusedSetup(t)
	rows := refusedRows(nil)
	for i := 9; i < 40; i += 3 {
		rows[i][1] = "happy"
	}
	var calls atomic.Int32
	job := refusedJob(nil)
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		calls.Add(1)
		return rowsFunc(rows...).Extract(ctx, c, w)
	})
	r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: 1})
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 40, Inserted: 28, Rejected: 12}, rep.Counts) // 11 "happy", 1 "five"
	require.Equal(t, int32(1), calls.Load(), "extracted once: the staging that failed and the one that loaded replay its spool")
	var happy int
	for _, e := range exceptionsOf(t, db, rep.BatchID) {
		if e.Value == "happy" {
			happy++
		}
	}
	require.Equal(t, 11, happy)
}

// TestStagingRefusedValuesLongAndDotted: a value PostgreSQL shortened in
// its message (over 100 bytes) is found by its row and its first bytes;
// a short value that merely ends in "..." is its whole self, found by
// value: a good row holding its prefix stays.
func TestStagingRefusedValuesLongAndDotted(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.MustExec(`CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
		CREATE DOMAIN short AS text CHECK (length(VALUE) <= 110);
		CREATE TABLE t (id int PRIMARY KEY, m mood, s short)`)
	long := strings.Repeat("x", 120)
	var rows [][]any
	for id := int64(1); id <= 20; id++ {
		rows = append(rows, []any{id, "happy", "ok"})
	}
	rows[2][1] = "happy..." // id 3: refused, its text ends in dots
	rows[5][2] = long       // id 6: refused, shortened in the message
	rows[9][2] = long[:110] // id 10: good, shares the first 100 bytes
	var calls atomic.Int32
	job := backfill.Job{Name: "t", Chunker: backfill.List("f"), Rollback: backfill.RollbackNone,
		Target:    backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "m", "s"}},
		Extractor: flipping(rows, &calls)}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 20, Inserted: 18, Rejected: 2}, rep.Counts)
	var ids []int
	require.NoError(t, db.Select(&ids, `SELECT id FROM t WHERE id IN (3, 6, 10) ORDER BY id`))
	require.Equal(t, []int{10}, ids)
}

// flipping is an extractor that writes rows in their order on odd calls
// and in reverse on even ones, counting its calls.
func flipping(rows [][]any, calls *atomic.Int32) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		order := slices.Clone(rows)
		if calls.Add(1)%2 == 0 {
			slices.Reverse(order)
		}
		for _, r := range order {
			if err := w.Write(ctx, r...); err != nil {
				return err
			}
		}
		return nil
	})
}

// refusedKillJob is the job of TestKillDashNineWhileIsolating: 20 chunks
// of 25 rows, each with one enum label PostgreSQL refuses, so that every
// chunk is staged twice, with a sleep per extraction so that a kill lands
// between and inside stagings.
func refusedKillJob() backfill.Job {
	return backfill.Job{Name: "refused-kill", Chunker: backfill.IntRange(0, 500, 25), ChunkColumn: "id", Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "m"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			time.Sleep(10 * time.Millisecond)
			for id := c.Lo; id < c.Hi; id++ {
				m := "ok"
				if id%25 == 7 {
					m = fmt.Sprintf("bad-%d", id)
				}
				if err := w.Write(ctx, id, m); err != nil {
					return err
				}
			}
			return nil
		})}
}

func init() {
	childProcess("BACKFILL_REFUSED_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, quickFencing(backfill.Config{Concurrency: 2}))
		if err != nil {
			return err
		}
		job := refusedKillJob()
		inner := job.Extractor
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Lo >= 450 {
				time.Sleep(time.Minute) // the parent kills the child first
			}
			return inner.Extract(ctx, c, w)
		})
		_, err = r.Run(context.Background(), job)
		return err
	})
}

// TestKillDashNineWhileIsolating: a run whose chunks each restage without
// a refused row, killed with SIGKILL mid-run and resumed, ends like an
// uninterrupted run: the same rows, each refused row queued once, every
// chunk balanced.
func TestKillDashNineWhileIsolating(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns a process")
	}
	ctx := context.Background()
	create := `CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE TABLE t (id bigint PRIMARY KEY, m mood)`
	ref := pgtest.New(t)
	ref.MustExec(create)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	refRep, err := r.Run(ctx, refusedKillJob())
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 500, Inserted: 480, Rejected: 20}, refRep.Counts)
	var want []string
	require.NoError(t, ref.Select(&want, `SELECT row(id, m)::text FROM t ORDER BY id`))

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	db.MustExec(create)
	killChildWhen(t, db, "BACKFILL_REFUSED_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, 5)

	r, err = backfill.New(db, quickFencing(backfill.Config{}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, refusedKillJob())
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, refRep.Counts, rep.Counts)
	var got []string
	require.NoError(t, db.Select(&got, `SELECT row(id, m)::text FROM t ORDER BY id`))
	require.Equal(t, want, got)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 20, "each refused row queued once, across the kill")
	seen := map[string]bool{}
	for _, e := range ex {
		require.False(t, seen[e.Value], "queued twice: %s", e.Value)
		seen[e.Value] = true
		require.Contains(t, e.Reason, "invalid input value for enum mood")
	}
	for _, c := range manifestChunks(t, db, rep.BatchID) {
		require.Equal(t, backfill.ChunkDone, c.Status)
		require.True(t, c.Balanced(), "%s: %+v", c.Chunk.ID, c.Counts)
	}
}

// TestStagingCopiesOnTheChunkConnection: with the default DB, each
// staging of a chunk (the first and every restaging after a refused
// value) COPYs on lib/pq's connection of the chunk's own transaction
// (pgstore.PGStager.CopyRows), the refused values are isolated as
// through database/sql, and every connection taken for a chunk's
// transaction is back in the pool when Run returns, whether the chunk
// committed or failed on a refused value.
func TestStagingCopiesOnTheChunkConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, limit := range []int{0, -1} {
		t.Run(fmt.Sprint("MaxStagingRejects=", limit), func(t *testing.T) {
			t.Parallel()
			db := refusedSetup(t)
			bad := map[int]string{1: "m", 17: "ip", 40: "a"}
			job := refusedJob(refusedRows(bad))
			r, err := backfill.New(db, &backfill.Config{MaxStagingRejects: limit, MaxAttempts: 1})
			require.NoError(t, err)
			before := pgstore.RawCopies.Load()
			rep, err := r.Run(ctx, job)
			// At least one COPY per staging attempt (other tests' runs in
			// parallel add theirs).
			if limit < 0 {
				require.ErrorContains(t, err, `row 1 column "m" value "happy" refused`)
				require.GreaterOrEqual(t, pgstore.RawCopies.Load()-before, int64(1))
			} else {
				require.NoError(t, err)
				require.Equal(t, backfill.Counts{Read: 40, Inserted: 36, Rejected: 4}, rep.Counts)
				require.GreaterOrEqual(t, pgstore.RawCopies.Load()-before, int64(4), "one COPY, then one per refused value")
				var n int
				require.NoError(t, db.Get(&n, `SELECT count(*) FROM t`))
				require.Equal(t, 36, n)
			}
			require.Zero(t, db.Stats().InUse, "connections of chunk transactions left out of the pool")
		})
	}
}
