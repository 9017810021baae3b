package backfill

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestTimeInfinityIsPgconvs: the exported sentinels are the instants the
// conversion writes as 'infinity' and '-infinity'.
func TestTimeInfinityIsPgconvs(t *testing.T) {
	t.Parallel()
	require.True(t, TimeInfinity.Equal(pgconv.Infinity))
	require.True(t, TimeNegInfinity.Equal(pgconv.NegInfinity))
	got, reason := pgstore.ConvertValue(Column{Name: "c", BaseType: "timestamptz"}, TimeInfinity)
	require.Empty(t, reason)
	require.Equal(t, "infinity", got)
	got, reason = pgstore.ConvertValue(Column{Name: "c", BaseType: "date"}, TimeNegInfinity)
	require.Empty(t, reason)
	require.Equal(t, "-infinity", got)
}

// TestColumnConvCopiesEveryField: each field of pgconv.Column is copied
// from the Column field of the same name, so that a field added there is
// not silently left zero.
func TestColumnConvCopiesEveryField(t *testing.T) {
	t.Parallel()
	c := Column{Name: "n", Type: "numeric(5,2)", BaseType: "numeric", MaxLen: 7, Precision: 5, Scale: 2, NotNull: true, Key: true}
	got := reflect.ValueOf(c.Conv())
	src := reflect.ValueOf(c)
	for i := range got.NumField() {
		name := got.Type().Field(i).Name
		f := src.FieldByName(name)
		require.True(t, f.IsValid(), "Column has no field %s", name)
		require.False(t, f.IsZero(), "test value of %s is zero", name)
		require.Equal(t, f.Interface(), got.Field(i).Interface(), name)
	}
}

func TestRowHashIsCanonicalAndUnambiguous(t *testing.T) {
	t.Parallel()
	info := TableInfo{
		Target: Target{Key: []string{"id"}},
		Columns: []Column{
			{Name: "id", Key: true, BaseType: "int8"},
			{Name: "a", BaseType: "text"},
			{Name: "b", BaseType: "text"},
			{Name: "n", BaseType: "numeric"},
			{Name: "f", BaseType: "float8"},
			{Name: "ts", BaseType: "timestamptz"},
		},
		Written: 6,
	}
	h := func(vals ...any) []byte { return pgstore.RowHash(info, vals) }
	base := []any{int64(1), "x", "y", "1.0", 0.5, "2024-01-01T00:00:00Z"}
	same := func(name string, a, b []any) {
		t.Helper()
		if !bytes.Equal(h(a...), h(b...)) {
			t.Errorf("%s: hashes differ", name)
		}
	}
	differ := func(name string, a, b []any) {
		t.Helper()
		if bytes.Equal(h(a...), h(b...)) {
			t.Errorf("%s: hashes equal", name)
		}
	}
	with := func(i int, v any) []any {
		c := append([]any(nil), base...)
		c[i] = v
		return c
	}
	same("the key is not hashed", base, with(0, int64(2)))
	same("numeric exponent", base, with(3, "10e-1"))
	same("numeric spelling", base, with(3, " +01.0"))
	differ("numeric scale", base, with(3, "1.00"))
	differ("negative zero", with(4, 0.0), with(4, math.Copysign(0, -1)))
	same("NaN payloads", with(4, math.NaN()), with(4, math.Float64frombits(0x7ff8000000000001)))
	same("instant in another zone", base, with(5, time.Date(2023, 12, 31, 19, 0, 0, 0, time.FixedZone("EST", -5*3600)).Format(time.RFC3339Nano)))
	differ("text changed", base, with(1, "z"))
	differ("NULL vs empty", with(1, nil), with(1, ""))
	differ("field boundaries", func() []any { c := with(1, "ab"); c[2] = "c"; return c }(), func() []any { c := with(1, "a"); c[2] = "bc"; return c }())
	differ("numeric value", base, with(3, "1.01"))
	differ("NaN vs number", with(4, math.NaN()), with(4, 0.0))
}

// heldLock is one advisory lock of the two-int key space (pg_locks:
// classid, objid, objsubid 2).
type heldLock struct {
	NS   int32  `db:"classid"`
	Key  int32  `db:"objid"`
	Mode string `db:"mode"`
}

// stageAndMerge merges rows into info's target in a new transaction and
// returns it, uncommitted, with the advisory locks it holds.
func stageAndMerge(t *testing.T, db *sqlx.DB, m *pgstore.Merger, info TableInfo, rows ...[]any) (*sqlx.Tx, []heldLock) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	defer st.Close()
	for i, r := range rows {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	_, err = st.Merge(ctx)
	require.NoError(t, err)
	var locks []heldLock
	// classid and objid are the int4 keys as oids (unsigned).
	require.NoError(t, tx.Select(&locks, `SELECT (classid::bigint - CASE WHEN classid::bigint > 2147483647 THEN 4294967296 ELSE 0 END)::int AS classid,
			(objid::bigint - CASE WHEN objid::bigint > 2147483647 THEN 4294967296 ELSE 0 END)::int AS objid, mode
		FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid() ORDER BY 2`))
	return tx, locks
}

// TestMergeKeyLocks: what a merge locks. A small chunk holds the target's
// lock -1 shared and one exclusive lock per key hash (keys equal under the
// column's collation share one; an integer key's locks cover ranges of
// 4,096 values); a chunk with more key hashes than
// mergeLockKeys, or with keys of a type without a hash function, holds
// lock -1 exclusively and nothing else. Targets have their own namespace.
// A merge of a key waits for the transaction holding its lock.
func TestMergeKeyLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	db.MustExec(`CREATE TABLE a (k text COLLATE ci PRIMARY KEY, v int)`)
	db.MustExec(`CREATE TABLE b (k text PRIMARY KEY, v int)`)
	db.MustExec(`CREATE TABLE bits (k bit(8) PRIMARY KEY, v int)`)
	m := pgstore.NewMerger()
	prep := func(table string) TableInfo {
		info, err := m.Prepare(ctx, db, Target{Table: table, Key: []string{"k"}})
		require.NoError(t, err)
		return info
	}
	a, b, bits := prep("a"), prep("b"), prep("bits")

	tx, locks := stageAndMerge(t, db, m, a, []any{"Apple", 1}, []any{"pear", 2}, []any{"APPLE", 3}, []any{"fig", 4})
	require.NoError(t, tx.Rollback())
	nsA := pgstore.LockNamespace("public.a")
	require.Len(t, locks, 1+3, "apple (both spellings), pear, fig and the target")
	require.Equal(t, heldLock{nsA, pgstore.WholeTarget, "ShareLock"}, locks[0])
	for _, l := range locks[1:] {
		require.Equal(t, nsA, l.NS)
		require.GreaterOrEqual(t, l.Key, int32(0))
		require.Equal(t, "ExclusiveLock", l.Mode)
	}

	many := make([][]any, pgstore.MergeLockKeys+1)
	for i := range many {
		many[i] = []any{fmt.Sprintf("k%d", i), i}
	}
	big, locks := stageAndMerge(t, db, m, b, many...)
	require.Equal(t, []heldLock{{pgstore.LockNamespace("public.b"), pgstore.WholeTarget, "ExclusiveLock"}}, locks, "more keys than mergeLockKeys")

	db.MustExec(`CREATE TABLE ids (k bigint PRIMARY KEY, v int)`)
	ids := prep("ids")
	rows := make([][]any, 10000)
	for i := range rows {
		rows[i] = []any{int64(100000 + i), i}
	}
	tx, locks = stageAndMerge(t, db, m, ids, rows...)
	require.NoError(t, tx.Rollback())
	require.Equal(t, heldLock{pgstore.LockNamespace("public.ids"), pgstore.WholeTarget, "ShareLock"}, locks[0])
	require.Len(t, locks, 1+3, "ids 100,000 to 109,999: the ranges of 4,096 from 98,304, 102,400 and 106,496")

	tx, locks = stageAndMerge(t, db, m, bits, []any{"10101010", 1})
	require.NoError(t, tx.Rollback())
	require.Equal(t, []heldLock{{pgstore.LockNamespace("public.bits"), pgstore.WholeTarget, "ExclusiveLock"}}, locks, "bit has no hash function")

	// Another target does not wait for b's whole-target lock; a key of b
	// does, until b's transaction ends.
	tx, _ = stageAndMerge(t, db, m, a, []any{"k1", 1})
	require.NoError(t, tx.Rollback())
	tx2, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx2.Get(&pid, `SELECT pg_backend_pid()`))
	done := make(chan error, 1)
	go func() {
		st, err := m.Stage(ctx, tx2, b)
		if err == nil {
			defer st.Close()
			err = st.Add(ctx, 1, []any{"k1", 100})
		}
		if err == nil {
			_, err = st.Merge(ctx)
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, db.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)`, pid))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the merge of k1 never waited for the transaction holding b")
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, big.Commit())
	require.NoError(t, <-done)
	require.NoError(t, tx2.Commit())
	var v int
	require.NoError(t, db.Get(&v, `SELECT v FROM b WHERE k = 'k1'`))
	require.Equal(t, 100, v, "the waiting merge saw the committed row and updated it")
}

// TestMergeNeverScansTheTargetSequentially: the merge's statements look
// rows up in the target through its unique index, also when the planner
// believes the target empty (vacuumed while empty). With a sequential
// scan as the inner side of a lookup, a statement that also inserts into
// the target reads the rows it has inserted so far once per staged row:
// n²/2 tuples for a chunk of n (a 1,000,000-row chunk ran for hours).
// History's statements also read the versions of the chunk's keys by one
// lookup per key (a 20,000-row chunk took 13 s when the planner, without
// statistics on staging, read the whole target per staged key).
func TestMergeNeverScansTheTargetSequentially(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, tc := range []struct {
		name, ddl string
		target    Target
		rows      func(i int) []any
	}{
		{"upsert", `CREATE TABLE tgt (id bigint PRIMARY KEY, v int)`,
			Target{Table: "tgt", Key: []string{"id"}, Columns: []string{"id", "v"}},
			func(i int) []any { return []any{int64(i), int64(i)} }},
		{"append_only", `CREATE TABLE tgt (id bigint PRIMARY KEY, v int)`,
			Target{Table: "tgt", Key: []string{"id"}, Columns: []string{"id", "v"}, Mode: AppendOnly},
			func(i int) []any { return []any{int64(i), int64(i)} }},
		{"history", `CREATE TABLE tgt (k text, valid_from int, valid_to int, v int, PRIMARY KEY (k, valid_from))`,
			Target{Table: "tgt", Key: []string{"k"}, Columns: []string{"k", "valid_from", "v"}, Mode: History},
			func(i int) []any { return []any{fmt.Sprint("k", i%100), int64(i), int64(i)} }},
	} {
		_, err := db.Exec(`DROP TABLE IF EXISTS tgt; ` + tc.ddl)
		require.NoError(t, err)
		_, err = db.Exec(`VACUUM ANALYZE tgt`) // empty: reltuples 0
		require.NoError(t, err)
		tx, err := db.Beginx()
		require.NoError(t, err)
		m := pgstore.NewMerger()
		info, err := m.Prepare(ctx, tx, tc.target)
		require.NoError(t, err, tc.name)
		st, err := m.Stage(ctx, tx, info)
		require.NoError(t, err)
		for i := range 2000 {
			require.NoError(t, st.Add(ctx, int64(i+1), tc.rows(i)))
		}
		s := st.(*pgstore.PGStager)
		require.NoError(t, s.EndCopy(ctx))
		_, err = tx.Exec(`ANALYZE ` + s.Q.Stage)
		require.NoError(t, err)
		_, err = s.PlannerSettings(ctx)
		require.NoError(t, err)
		for name, q := range map[string]string{"upsert": s.Q.Upsert, "insert": s.Q.Insert, "update": s.Q.Update,
			"close intervals": s.Q.CloseIntervals, "check intervals": s.Q.CheckIntervals, "target conflicts": s.Q.TargetConflicts} {
			if q == "" {
				continue
			}
			var plan []string
			require.NoError(t, tx.Select(&plan, `EXPLAIN `+q, s.Args(q)...), "%s %s", tc.name, name)
			text := strings.Join(plan, "\n")
			require.NotContains(t, text, "Seq Scan on tgt", "%s %s:\n%s", tc.name, name, text)
			if name == "close intervals" {
				require.Contains(t, text, "Index Cond", "close intervals reads the chunk's keys by lookups:\n%s", text)
			}
			if name == "insert" || name == "check intervals" {
				// Inserts look for the staged identity, History reads the
				// versions of the chunk's keys: each read of the target is
				// a lookup (an Index Cond), never the whole index against
				// every staged key. (The updates' joins are left to the
				// planner, which orders them by the target's estimated
				// size: a target it believes empty is read whole once.)
				for i, line := range plan {
					if strings.Contains(line, " on tgt") && strings.Contains(line, "Scan") {
						next := strings.Join(plan[i+1:min(i+3, len(plan))], "\n")
						require.Contains(t, next, "Index Cond", "%s %s: a read of the whole target:\n%s", tc.name, name, text)
					}
				}
			}
		}
		require.NoError(t, st.Close())
		require.NoError(t, tx.Rollback())
	}
}

// TestMergeRefusalPrechecks: the set-based pre-checks name exactly the
// staged rows that another unique index (against the target, or an
// earlier staged row), a CHECK, or the btree limit would refuse, under
// the merge's planner settings, and not a row whose unique value belongs
// to a target row the chunk itself changes.
func TestMergeRefusalPrechecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE t (id int PRIMARY KEY, code text UNIQUE, qty int CHECK (qty >= 0), note text);
		CREATE INDEX t_note_idx ON t (note);
		INSERT INTO t VALUES (1000, 'taken', 0, 'x'), (1001, 'moving', 0, 'x')`)
	require.NoError(t, err)
	big := make([]byte, 1500)
	_, _ = rand.Read(big)
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, tx, Target{Table: "t", Key: []string{"id"}})
	require.NoError(t, err)
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	for i, r := range [][]any{
		{int64(1), "c1", int64(1), "n"},
		{int64(2), "taken", int64(2), "n"},                  // 1000's code
		{int64(3), "c1", int64(3), "n"},                     // row 1's code
		{int64(4), "c4", int64(-1), "n"},                    // CHECK
		{int64(5), "c5", int64(5), hex.EncodeToString(big)}, // 3,000 bytes in t_note_idx
		{int64(6), "moving", int64(6), "n"},                 // 1001's code, but 1001 is staged too
		{int64(1001), "moved", int64(0), "n"},
		{int64(7), nil, nil, nil},
	} {
		require.NoError(t, st.Add(ctx, int64(i+1), r))
	}
	s := st.(*pgstore.PGStager)
	require.NoError(t, s.EndCopy(ctx))
	_, err = s.PlannerSettings(ctx)
	require.NoError(t, err)
	iso := &pgstore.Isolation{S: s}
	require.Equal(t, []int64{2, 3, 4, 5}, iso.Suspects(ctx))
	var ok bool
	require.NoError(t, tx.Get(&ok, `SELECT true`), "the transaction is healthy")
	require.True(t, ok)
}

// TestMergeRefusalsBisect: rows no pre-check can name (a foreign key) are
// found by bisection, in O(k log n) merges of parts of the chunk, not one
// merge per row: each merge stages its part from the held rows with one
// scan of them, which the transaction's statistics count.
func TestMergeRefusalsBisect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
		CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent)`)
	require.NoError(t, err)
	tx, err := db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback()
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, tx, Target{Table: "t", Key: []string{"id"}})
	require.NoError(t, err)
	info.Chunk.MaxRefused = 10
	st, err := m.Stage(ctx, tx, info)
	require.NoError(t, err)
	const n = 4000
	bad := []int64{1, 1234, 3000, n}
	for i := int64(1); i <= n; i++ {
		ref := i % 10
		if slices.Contains(bad, i) {
			ref = 99
		}
		require.NoError(t, st.Add(ctx, i, []any{i, ref}))
	}
	res, err := st.Merge(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n-len(bad), res.Inserted)
	var rows []int64
	for _, e := range res.Rejected {
		rows = append(rows, e.Row)
		require.Contains(t, e.Reason, `violates foreign key constraint "t_ref_fkey"`)
	}
	require.Equal(t, bad, rows)
	var scans int64
	require.NoError(t, tx.Get(&scans, `SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables WHERE relname LIKE 'backfill_held_%'`))
	// 4 rows in 4,000: about 4 * 2 * log2(4000) = 96 merges; one per row
	// would be 4,000.
	require.Positive(t, scans)
	require.Less(t, scans, int64(200), "merges of parts: %d", scans)
	var count int
	require.NoError(t, tx.Get(&count, `SELECT count(*) FROM t`))
	require.Equal(t, n-len(bad), count)
}

// TestUpsertSettledByLock: a replay of unchanged Upsert chunks is decided
// by the statement that locks the rows to change, which looks every
// staged key up once; the upsert, whose join would look every key up a
// second time, runs only for the chunks with something to write (issue
// 15: half of an unchanged replay's merge). The counts stay exact, and
// a chunk with a changed, a deleted and an unchanged row still updates,
// inserts and locks as before.
func TestUpsertSettledByLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	sdb := &stmtDB{DB: Postgres(db)}
	r, err := NewWithDB(sdb, &Config{WorkerID: "settled"})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 30, 10)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	// upserts counts, per chunk transaction with a staging COPY, the
	// upsert statements it ran.
	upserts := func() (perChunk []int) {
		sdb.mu.Lock()
		defer sdb.mu.Unlock()
		for _, tx := range sdb.txs {
			copied, n := false, 0
			for _, q := range tx.stmts {
				copied = copied || strings.HasPrefix(q, "COPY ") && !strings.Contains(q, `"backfill".chunks`)
				if strings.Contains(q, "WITH j AS MATERIALIZED") {
					n++
				}
			}
			if copied {
				perChunk = append(perChunk, n)
			}
		}
		sdb.txs = nil
		return perChunk
	}
	upserts()

	job.NewRun = true
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Unchanged: 30}, rep.Counts)
	require.Equal(t, []int{0, 0, 0}, upserts(), "upserts per chunk of an unchanged replay")

	// Chunk [10, 20): one row changed, one deleted.
	_, err = db.Exec(`UPDATE live SET v = 'changed' WHERE id = 12; DELETE FROM live WHERE id = 15`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Inserted: 1, Updated: 1, Unchanged: 28}, rep.Counts)
	require.Equal(t, []int{0, 1, 0}, upserts(), "upserts per chunk of a replay with one chunk to change")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM live WHERE v = 'v' || id`))
	require.Equal(t, 30, n)

	// Only a deleted row: nothing to lock, one to insert.
	_, err = db.Exec(`DELETE FROM live WHERE id = 25`)
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Inserted: 1, Unchanged: 29}, rep.Counts)
	require.Equal(t, []int{0, 0, 1}, upserts())
}

// TestUpsertSettledConcurrentDelete: a row that differs in the lock
// statement's snapshot and that another transaction deletes while the
// lock waits for it is not settled as unchanged: the upsert decides it
// from a new snapshot and inserts it again, as it did before the lock
// statement settled chunks.
func TestUpsertSettledConcurrentDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	r, err := New(db, &Config{WorkerID: "settled-delete"})
	require.NoError(t, err)
	job := liveJob(nil)
	job.Chunker = IntRange(0, 10, 10)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE live SET v = 'changed' WHERE id = 5`)
	require.NoError(t, err)

	other, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = other.Rollback() }()
	_, err = other.Exec(`DELETE FROM live WHERE id = 5`)
	require.NoError(t, err)

	job.NewRun = true
	done := goRun(ctx, r, job)
	// The lock statement waits for the deleting transaction's row lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE OF t%'`))
		return n == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, other.Commit())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, Counts{Read: 10, Inserted: 1, Unchanged: 9}, res.rep.Counts)
	var v string
	require.NoError(t, db.Get(&v, `SELECT v FROM live WHERE id = 5`))
	require.Equal(t, "v5", v)
}

// update rewrites the golden files of generated SQL:
// go test -run Golden -update.
var update = flag.Bool("update", false, "rewrite testdata/*.golden.sql")

// goldenColumns is a hand-built target table: plain columns of types the
// merge compares by their equality, as text (json, point) and under a
// collation of their own, a column whose name needs quoting, and the
// columns the library fills.
func goldenColumns() []Column {
	return []Column{
		{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true},
		{Name: "name", Type: "text", BaseType: "text", Collation: `pg_catalog."C"`},
		{Name: "amount", Type: "numeric(12,2)", BaseType: "numeric", Precision: 12, Scale: 2},
		{Name: "doc", Type: "json", BaseType: "json", TextCompare: true},
		{Name: "pos", Type: "point", BaseType: "point", TextCompare: true},
		{Name: `Odd "col"`, Type: "text", BaseType: "text"},
		{Name: "version", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "k", Type: "text", BaseType: "text", NotNull: true},
		{Name: "valid_from", Type: "timestamp with time zone", BaseType: "timestamptz", NotNull: true},
		{Name: "valid_to", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "ingested_at", Type: "timestamp with time zone", BaseType: "timestamptz"},
		{Name: "row_hash", Type: "bytea", BaseType: "bytea"},
		{Name: "inserted_by", Type: "bigint", BaseType: "int8"},
		{Name: "updated_by", Type: "bigint", BaseType: "int8"},
	}
}

// goldenTarget is one golden case: a target and whether its chunk writes
// an undo log.
type goldenTarget struct {
	name   string
	target Target
	unique [][]string
	undo   bool
}

func goldenTargets() []goldenTarget {
	cols := []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"}
	base := func(m func(*Target)) Target {
		t := Target{Table: "sales.orders", Key: []string{"id"}, Columns: cols, Mode: Upsert}
		m(&t)
		return t
	}
	lineage := func(t *Target) {
		t.Lineage = Lineage{InsertedBy: "inserted_by", UpdatedBy: "updated_by"}
		t.IngestedAt = "ingested_at"
	}
	byID := [][]string{{"id"}}
	history := [][]string{{"id", "valid_from"}}
	histCols := append([]string{"valid_from"}, cols...)
	return []goldenTarget{
		{name: "upsert_source_wins", target: base(func(t *Target) { t.Conflict = SourceWins; t.Columns = cols[:6] }), unique: byID},
		{name: "upsert_source_wins_version", target: base(func(t *Target) { t.Conflict = SourceWins; t.Version = "version" }), unique: byID},
		{name: "upsert_target_wins", target: base(func(t *Target) { t.Conflict = TargetWins }), unique: byID},
		{name: "upsert_newer_version_wins", target: base(func(t *Target) { t.Conflict = NewerVersionWins; t.Version = "version" }), unique: byID},
		{name: "upsert_keep_first", target: base(func(t *Target) { t.Duplicates = KeepFirst }), unique: byID},
		{name: "upsert_hash", target: base(func(t *Target) { t.HashColumn = "row_hash" }), unique: byID},
		{name: "upsert_key_only", target: base(func(t *Target) { t.Columns = []string{"id"} }), unique: byID},
		// A key under a collation of its own: equal keys may be stored in
		// other forms, which the checks look up by the key's equality.
		{name: "upsert_collated_key", target: base(func(t *Target) { t.Key = []string{"name"} }), unique: [][]string{{"name"}}},
		{name: "upsert_source_wins_lineage", target: base(lineage), unique: byID},
		{name: "upsert_source_wins_lineage_undo", target: base(lineage), unique: byID, undo: true},
		{name: "upsert_target_wins_lineage_undo", target: base(func(t *Target) { lineage(t); t.Conflict = TargetWins }), unique: byID, undo: true},
		{name: "upsert_newer_version_wins_lineage_undo", target: base(func(t *Target) {
			lineage(t)
			t.Conflict, t.Version, t.HashColumn = NewerVersionWins, "version", "row_hash"
		}), unique: byID, undo: true},
		{name: "append_only", target: base(func(t *Target) { t.Mode = AppendOnly }), unique: byID},
		{name: "append_only_lineage", target: base(func(t *Target) { t.Mode = AppendOnly; lineage(t); t.HashColumn = "row_hash" }), unique: byID},
		{name: "history", target: base(func(t *Target) { t.Mode, t.Columns = History, histCols }), unique: history},
		{name: "history_lineage_undo", target: base(func(t *Target) { t.Mode, t.Columns = History, histCols; lineage(t) }), unique: history, undo: true},
		{name: "keyless", target: base(func(t *Target) {
			t.Mode, t.Key = Keyless, []string{"k"}
			t.Derive = []KeyRule{{Column: "k", From: "name", Rules: []Normalizer{Trim}}}
		}), unique: [][]string{{"k"}}},
	}
}

// goldenInfo resolves a golden case as Prepare would, without a server.
func goldenInfo(t testing.TB, g goldenTarget) TableInfo {
	t.Helper()
	info, err := pgstore.ResolveTarget(g.target, goldenColumns(), g.unique)
	require.NoError(t, err, g.name)
	info.Chunk = backfilltype.ChunkRef{BatchID: 7, Seq: 3}
	if g.undo {
		info.Chunk.UndoTable = `"backfill"."undo"`
	}
	if info.Target.Lineage.UpdatedBy != "" {
		info.Chunk.DeliveredTable = `"backfill"."delivered"`
	}
	return info
}

// checkGolden compares got with testdata/name.golden.sql byte for byte,
// or rewrites the file under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden.sql")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run Golden -update to create it")
	require.Equal(t, string(want), got, "generated SQL of %s differs from %s (go test -run Golden -update rewrites it)", name, path)
}

// goldenStatements renders named statements, skipping empty ones, in the
// given order.
func goldenStatements(stmts [][2]string) string {
	var b strings.Builder
	for _, s := range stmts {
		if s[1] == "" {
			continue
		}
		b.WriteString("-- " + s[0] + "\n" + strings.TrimSpace(s[1]) + ";\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// mergeStatements lists the fields of q in declaration order.
func mergeStatements(q pgstore.PGMergeSQL) [][2]string {
	v := reflect.ValueOf(q)
	var out [][2]string
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if v.Field(i).Kind() != reflect.String {
			continue
		}
		out = append(out, [2]string{strings.ToLower(name[:1]) + name[1:], v.Field(i).String()})
	}
	return out
}

// TestMergeSQLGolden pins the SQL buildMergeSQL generates for each mode
// and policy: a change to it shows in review as a change of
// testdata/merge_*.golden.sql.
func TestMergeSQLGolden(t *testing.T) {
	for _, g := range goldenTargets() {
		t.Run(g.name, func(t *testing.T) {
			checkGolden(t, "merge_"+g.name, goldenStatements(mergeStatements(pgstore.BuildMergeSQL(goldenInfo(t, g)))))
		})
	}
}

// TestComparedColumns pins the one definition of what a merge compares,
// per mode and policy.
func TestComparedColumns(t *testing.T) {
	want := map[string]pgstore.ComparedColumns{
		"upsert_source_wins": {Identity: []string{"id"}, Content: []string{"name", "amount", "doc", "pos", `Odd "col"`},
			Written: []string{"name", "amount", "doc", "pos", `Odd "col"`}, Tracked: []string{"name", "amount", "doc", "pos", `Odd "col"`},
			Compared: []string{"name", "amount", "doc", "pos", `Odd "col"`}, Checked: []string{"name", "amount", "doc", "pos", `Odd "col"`}},
		"upsert_newer_version_wins_lineage_undo": {Identity: []string{"id"},
			Content: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash", "ingested_at", "inserted_by", "updated_by"},
			Written: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash", "ingested_at", "updated_by"},
			Tracked: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			// pos, a point, is passed to PostgreSQL's input as text: the
			// row hash leaves it out, the merge compares it beside.
			Compared: []string{"row_hash", "pos"},
			Checked:  []string{"name", "amount", "doc", "pos", `Odd "col"`, "version", "row_hash"}},
		"history": {Identity: []string{"id", "valid_from"}, Content: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Written: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}, Tracked: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Compared: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}, Checked: []string{"name", "amount", "doc", "pos", `Odd "col"`, "version"}},
		"keyless": {Identity: []string{"k"}, Content: []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"},
			Written: []string{"id", "name", "amount", "doc", "pos", `Odd "col"`, "version"}, Tracked: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"},
			Compared: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"}, Checked: []string{"id", "amount", "doc", "pos", `Odd "col"`, "version"}},
	}
	for _, g := range goldenTargets() {
		w, ok := want[g.name]
		if !ok {
			continue
		}
		got := pgstore.CompareColumns(goldenInfo(t, g))
		got.Cols = nil
		require.Equal(t, w, got, g.name)
	}
}

func TestSQLF(t *testing.T) {
	require.Equal(t, `SELECT "{b}" FROM x WHERE {unknown} AND {`, pgstore.SQLf(`SELECT {a} FROM x WHERE {unknown} AND {`, "a", `"{b}"`, "b", "never"))
}

// TestUpsertRecordsItsDeliveries: an Upsert that changes some rows of a
// chunk records the rows it leaves unchanged that an earlier batch wrote
// (the delivered summary) in its own statement, not in a second pass
// over the chunk's rows; a settled chunk still records them after its
// lock statement.
func TestUpsertRecordsItsDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE dl (id bigint PRIMARY KEY, v text NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	sdb := &stmtDB{DB: Postgres(db)}
	r, err := NewWithDB(sdb, &Config{WorkerID: "deliveries"})
	require.NoError(t, err)
	changed := ""
	job := Job{Name: "dl", Chunker: IntRange(0, 30, 10), Target: Target{Table: "dl", Key: []string{"id"}, Columns: []string{"id", "v"}},
		Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				v := fmt.Sprint("v", id)
				if id == 12 {
					v += changed
				}
				if err := w.Write(ctx, id, v); err != nil {
					return err
				}
			}
			return nil
		})}
	rep1, err := r.Run(ctx, job)
	require.NoError(t, err)

	// Per chunk transaction with a staging COPY: its upserts and its
	// delivered summaries of their own.
	stmts := func() (upserts, summaries []int) {
		sdb.mu.Lock()
		defer sdb.mu.Unlock()
		for _, tx := range sdb.txs {
			copied, u, d := false, 0, 0
			for _, q := range tx.stmts {
				copied = copied || strings.HasPrefix(q, "COPY ") && !strings.Contains(q, `"backfill".chunks`)
				switch {
				case strings.Contains(q, "WITH j AS MATERIALIZED"):
					u++
				case strings.Contains(q, `INSERT INTO "backfill".delivered`):
					d++
				}
			}
			if copied {
				upserts, summaries = append(upserts, u), append(summaries, d)
			}
		}
		sdb.txs = nil
		return upserts, summaries
	}
	stmts()

	changed = "-2"
	job.NewRun = true
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, Counts{Read: 30, Updated: 1, Unchanged: 29}, rep2.Counts)
	upserts, summaries := stmts()
	require.Equal(t, []int{0, 1, 0}, upserts, "upserts per chunk")
	require.Equal(t, []int{1, 0, 1}, summaries, "delivered summaries of their own per chunk")
	var got []struct {
		Seq   int    `db:"seq"`
		Owner int64  `db:"owner"`
		Lo    string `db:"lo"`
		Hi    string `db:"hi"`
		Count int64  `db:"row_count"`
	}
	require.NoError(t, db.Select(&got, `SELECT seq, owner, lo::text AS lo, hi::text AS hi, row_count FROM backfill.delivered WHERE batch_id = $1 ORDER BY seq`, rep2.BatchID))
	require.Len(t, got, 3)
	for i, d := range got {
		require.Equal(t, i, d.Seq)
		require.Equal(t, rep1.BatchID, d.Owner)
		require.Equal(t, fmt.Sprintf(`{"id": %d}`, 10*i), d.Lo)
		require.Equal(t, fmt.Sprintf(`{"id": %d}`, 10*i+9), d.Hi)
		require.Equal(t, int64(10-min(i%2, 1)), d.Count, "chunk %d", i)
	}
	// A rollback of batch 1 sees the 29 rows batch 2 delivered unchanged.
	pv, err := r.Rollback(ctx, job, RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, int64(29), pv.ConflictsDelivered)
}
