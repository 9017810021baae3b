package backfill_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// refusal is one kind of row the target refuses at merge time.
type refusal struct {
	name string
	// ddl adds the constraint (after the table "t" exists).
	ddl string
	// spoil makes good row i (values code, qty, ref, note) refused.
	spoil func(i int, code *string, qty, ref *int, note *string)
	// want: what every refused row's reason contains; column its Column.
	want   []string
	column string
}

// bigText returns n hex characters of random bytes: text that pglz does
// not compress, so that it stays over the btree limit in an index entry.
func bigText(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var refusals = []refusal{
	{name: "SecondUnique", ddl: `CREATE UNIQUE INDEX t_code_key ON t (code)`,
		spoil: func(i int, code *string, _, _ *int, _ *string) {
			// The first bad row takes the seeded row's code, the others
			// the code of the row before them.
			*code = fmt.Sprintf("c%d", i-1)
			if i == refusedRowsAt[0] {
				*code = "taken"
			}
		},
		want: []string{`duplicate key value violates unique constraint "t_code_key" (SQLSTATE 23505)`, `constraint "t_code_key"`, "already exists"}, column: "code"},
	{name: "PartialUnique", ddl: `CREATE UNIQUE INDEX t_code_key ON t (code) WHERE qty >= 0`, // no pre-check: bisection
		spoil: func(i int, code *string, _, _ *int, _ *string) {
			*code = fmt.Sprintf("c%d", i-1)
			if i == refusedRowsAt[0] {
				*code = "taken"
			}
		},
		want: []string{`duplicate key value violates unique constraint "t_code_key" (SQLSTATE 23505)`}, column: "code"},
	{name: "Check", ddl: `ALTER TABLE t ADD CONSTRAINT t_qty_check CHECK (qty >= 0)`,
		spoil: func(_ int, _ *string, qty, _ *int, _ *string) { *qty = -1 },
		want:  []string{`violates check constraint "t_qty_check" (SQLSTATE 23514)`, `constraint "t_qty_check"`}},
	// A CHECK that raises a data error (22012) instead of failing: its
	// pre-check fails and is skipped; bisection finds the rows.
	{name: "CheckThatErrors", ddl: `ALTER TABLE t ADD CONSTRAINT t_qty_check CHECK (100 / (qty + 1) > 0)`,
		spoil: func(_ int, _ *string, qty, _ *int, _ *string) { *qty = -1 },
		want:  []string{`division by zero (SQLSTATE 22012)`}},
	{name: "ForeignKey", ddl: `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 100);
			ALTER TABLE t ADD CONSTRAINT t_ref_fkey FOREIGN KEY (ref) REFERENCES parent`,
		spoil: func(_ int, _ *string, _, ref *int, _ *string) { *ref = 999 },
		want:  []string{`violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`, `constraint "t_ref_fkey"`, `Key (ref)=(999) is not present in table "parent"`}, column: "ref"},
	{name: "Trigger", ddl: `CREATE FUNCTION t_refuse_fn() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.note = 'boom' THEN RAISE EXCEPTION 'note % is refused', NEW.note; END IF;
				IF NEW.note = 'bang' THEN RAISE EXCEPTION 'note % is refused', NEW.note USING ERRCODE = 'BF001'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER t_refuse BEFORE INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION t_refuse_fn()`,
		spoil: func(i int, _ *string, _, _ *int, note *string) {
			*note = "boom"
			if i%2 == 0 {
				*note = "bang" // a trigger's own SQLSTATE
			}
		},
		want: []string{"is refused (SQLSTATE ", `trigger "t_refuse"`, "PL/pgSQL function t_refuse_fn() line"}},
	{name: "BtreeLimit", ddl: `CREATE INDEX t_note_idx ON t (note)`,
		spoil: func(_ int, _ *string, _, _ *int, note *string) { *note = bigText(3000) },
		want:  []string{`exceeds btree version 4 maximum 2704 for index "t_note_idx" (SQLSTATE 54000)`}},
}

func refusalNamed(name string) refusal {
	i := slices.IndexFunc(refusals, func(r refusal) bool { return r.name == name })
	return refusals[i]
}

// refusedRowsAt are the rows of chunk "b" (ids 1..40) that the target
// refuses: the first and the last, and two in between.
var refusedRowsAt = []int{1, 17, 29, 40}

// refusalMode is a target in one mode over the columns code, qty, ref,
// note that the refusals spoil.
type refusalMode struct {
	mode   backfill.Mode
	create string // CREATE TABLE t, with a seeded row of code 'taken'
	seed   string
	target backfill.Target
	// row returns the values of row i; key its identity as queued.
	row func(i int, code string, qty, ref int, note string) []any
	key func(i int) string
}

var refusalModes = []refusalMode{
	{mode: backfill.Upsert,
		create: `CREATE TABLE t (id int PRIMARY KEY, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES (1000, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}},
		row:    func(i int, code string, qty, ref int, note string) []any { return []any{i, code, qty, ref, note} },
		key:    func(i int) string { return fmt.Sprintf("(%d)", i) }},
	{mode: backfill.AppendOnly,
		create: `CREATE TABLE t (id int PRIMARY KEY, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES (1000, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.AppendOnly},
		row:    func(i int, code string, qty, ref int, note string) []any { return []any{i, code, qty, ref, note} },
		key:    func(i int) string { return fmt.Sprintf("(%d)", i) }},
	// Two versions per id: a refused version leaves the other one tiled.
	{mode: backfill.History,
		create: `CREATE TABLE t (id int, valid_from date, valid_to date, code text, qty int, ref int, note text, PRIMARY KEY (id, valid_from))`,
		seed:   `INSERT INTO t VALUES (1000, '2024-01-01', NULL, 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, Columns: []string{"id", "valid_from", "code", "qty", "ref", "note"}},
		row: func(i int, code string, qty, ref int, note string) []any {
			return []any{(i + 1) / 2, fmt.Sprintf("2024-0%d-01", 2-i%2), code, qty, ref, note}
		},
		key: func(i int) string { return fmt.Sprintf("(%d, 2024-0%d-01)", (i+1)/2, 2-i%2) }},
	{mode: backfill.Keyless,
		create: `CREATE TABLE t (name_key text PRIMARY KEY, name text, code text, qty int, ref int, note text)`,
		seed:   `INSERT INTO t VALUES ('seed', 'seed', 'taken', 0, 0, 'seed')`,
		target: backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "code", "qty", "ref", "note"},
			Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}},
		row: func(i int, code string, qty, ref int, note string) []any {
			return []any{fmt.Sprintf(" Name%d ", i), code, qty, ref, note}
		},
		key: func(i int) string { return fmt.Sprintf("(name%d)", i) }},
}

// refusalJob: chunk "a" holds 10 good rows (ids 41..50: an all-insert
// chunk, after which Upsert takes its fast path), chunk "b" rows 1..40
// with refusedRowsAt spoiled by r.
func refusalJob(m refusalMode, r refusal) backfill.Job {
	rows := map[string][][]any{}
	for i := 1; i <= 50; i++ {
		code, qty, ref, note := fmt.Sprintf("c%d", i), i, i%50, fmt.Sprintf("n%d", i)
		if slices.Contains(refusedRowsAt, i) {
			r.spoil(i, &code, &qty, &ref, &note)
		}
		c := "b"
		if i > 40 {
			c = "a"
		}
		rows[c] = append(rows[c], m.row(i, code, qty, ref, note))
	}
	return backfill.Job{Name: "refusals", Chunker: backfill.List("a", "b"), Target: m.target, Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, row := range rows[c.Item] {
				if err := w.Write(ctx, row...); err != nil {
					return err
				}
			}
			return nil
		})}
}

func refusalSetup(t *testing.T, m refusalMode, r refusal) *sqlx.DB {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(m.create)
	require.NoError(t, err)
	_, err = db.Exec(r.ddl)
	require.NoError(t, err)
	_, err = db.Exec(m.seed)
	require.NoError(t, err)
	return db
}

// tableDump returns every row of t as text, sorted.
func tableDump(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT t::text FROM t ORDER BY 1`))
	return rows
}

// TestMergeRefusedRows: for every kind of row the target refuses at
// merge time (a second unique index, found by pre-check, and a partial
// one, found by bisection; a CHECK; a foreign key; a trigger raising
// P0001 or its own SQLSTATE; an index entry over the btree limit) and
// every mode, the refused rows are queued with their row, identity, the
// constraint (or trigger) and PostgreSQL's message; every other row
// merges; the counts balance; the run completes. A replay (a new run)
// changes nothing, and queues the same rows once more, under its own
// batch, once each.
func TestMergeRefusedRows(t *testing.T) {
	t.Parallel()
	for _, m := range refusalModes {
		for _, r := range refusals {
			t.Run(string(m.mode)+"/"+r.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := refusalSetup(t, m, r)
				run, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
				require.NoError(t, err)
				job := refusalJob(m, r)
				rep, err := run.Run(ctx, job)
				require.NoError(t, err)
				require.Equal(t, backfill.RunCompleted, rep.Status)
				require.Equal(t, backfill.Counts{Read: 50, Inserted: 46, Rejected: 4}, rep.Counts)

				check := func(batch int64) {
					t.Helper()
					ex := exceptionsOf(t, db, batch)
					require.Len(t, ex, len(refusedRowsAt))
					slices.SortFunc(ex, func(a, b backfill.Exception) int { return int(a.Row - b.Row) })
					for i, e := range ex {
						require.Equal(t, "list:b", e.ChunkID)
						require.EqualValues(t, refusedRowsAt[i], e.Row)
						require.Equal(t, m.key(refusedRowsAt[i]), e.Value)
						require.Equal(t, r.column, e.Column)
						require.Contains(t, e.Reason, "refused by the target: ")
						for _, w := range r.want {
							require.Contains(t, e.Reason, w)
						}
						require.NotEmpty(t, e.Raw)
					}
				}
				check(rep.BatchID)
				before := tableDump(t, db)
				require.Len(t, before, 1+46)
				if m.mode == backfill.History {
					// Every id has one open version, and the intervals tile.
					var open, ids, bad int
					require.NoError(t, db.Get(&open, `SELECT count(*) FROM t WHERE valid_to IS NULL`))
					require.NoError(t, db.Get(&ids, `SELECT count(DISTINCT id) FROM t`))
					require.Equal(t, ids, open)
					require.NoError(t, db.Get(&bad, `SELECT count(*) FROM (SELECT valid_to, lead(valid_from) OVER (PARTITION BY id ORDER BY valid_from) AS nxt FROM t) x
						WHERE valid_to IS DISTINCT FROM nxt`))
					require.Zero(t, bad)
				}

				job.NewRun = true
				rep2, err := run.Run(ctx, job)
				require.NoError(t, err)
				require.Equal(t, backfill.RunCompleted, rep2.Status)
				require.Equal(t, backfill.Counts{Read: 50, Unchanged: 46, Rejected: 4}, rep2.Counts)
				require.Equal(t, before, tableDump(t, db), "a replay changes nothing")
				check(rep2.BatchID)
				check(rep.BatchID) // the first run's exceptions are kept, not doubled
			})
		}
	}
}

// TestMergeRefusalsAreBounded: past Config.MaxMergeRefusals refused rows
// the chunk fails, naming the chunk, row, key and constraint, and nothing
// of it is merged; with a negative limit it fails at the first refused
// row, naming it too. A foreign key has no pre-check: bisection finds the
// rows.
func TestMergeRefusalsAreBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit int
		kind  string
		want  string
	}{
		{2, "Check", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 29 key (29) refused by the target: new row for relation "t" violates check constraint "t_qty_check" (SQLSTATE 23514); constraint "t_qty_check"`},
		{2, "ForeignKey", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 29 key (29) refused by the target: insert or update on table "t" violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`},
		{-1, "ForeignKey", `chunk 1 list:b (attempt 1): backfill: merge public.t: backfill: too many rejected rows: row 1 key (1) refused by the target: insert or update on table "t" violates foreign key constraint "t_ref_fkey" (SQLSTATE 23503)`},
	} {
		t.Run(fmt.Sprint(tc.limit, tc.kind), func(t *testing.T) {
			t.Parallel()
			db := refusalSetup(t, refusalModes[0], refusalNamed(tc.kind))
			run, err := backfill.New(db, &backfill.Config{MaxMergeRefusals: tc.limit, MaxAttempts: 3, RetryBackoff: time.Millisecond})
			require.NoError(t, err)
			rep, err := run.Run(context.Background(), refusalJob(refusalModes[0], refusalNamed(tc.kind)))
			require.Error(t, err)
			require.ErrorIs(t, err, backfill.ErrTooManyRejects)
			require.Contains(t, err.Error(), tc.want)
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.Equal(t, 1, rep.ChunksDone, "chunk a completed, chunk b not")
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t WHERE id <= 40`))
			require.Zero(t, n, "a failed chunk merges nothing")
			states, err := backfill.NewPGManifest("").Chunks(context.Background(), db, rep.BatchID)
			require.NoError(t, err)
			require.Equal(t, 1, states[1].Attempts, "not retried: retrying cannot help")
		})
	}
}

// TestMaxRejectsPerChunkCountsMergeRejects: Config.MaxRejectsPerChunk
// counts the rows the merge rejects (AppendOnly conflicting replays,
// rows the target refuses) with those the writer rejected: an
// AppendOnly chunk with 5 conflicting replays and a limit of 3 fails.
func TestMaxRejectsPerChunkCountsMergeRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (event_id text PRIMARY KEY, kind text NOT NULL, amount int CHECK (amount >= 0))`)
	require.NoError(t, err)
	first := [][]any{}
	for i := range 10 {
		first = append(first, []any{fmt.Sprintf("e%d", i), "sale", i})
	}
	job := func(name string, rows [][]any) backfill.Job {
		return backfill.Job{Name: name, Chunker: backfill.List("file-1"), Extractor: rowsFunc(rows...), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly}}
	}
	r, err := backfill.New(db, &backfill.Config{MaxRejectsPerChunk: 3, MaxAttempts: 1})
	require.NoError(t, err)
	_, err = r.Run(ctx, job("load", first))
	require.NoError(t, err)

	replay := slices.Clone(first)
	for i := range 5 {
		replay[i] = []any{fmt.Sprintf("e%d", i), "refund", i} // same event ID, other content
	}
	rep, err := r.Run(ctx, job("replay", replay))
	require.ErrorIs(t, err, backfill.ErrTooManyRejects)
	require.Contains(t, err.Error(), "5 in chunk list:file-1, more than 3 (Config.MaxRejectsPerChunk): 0 before the merge, 5 by the merge")
	require.Equal(t, backfill.RunFailed, rep.Status)

	// Rows the target refuses count too: 2 written rejects + 2 refusals.
	mixed := [][]any{{"n1", "sale", -1}, {"n2", "sale", -2}, {"n3", nil, 3}, {"n4", nil, 4}, {"n5", "sale", 5}}
	rep, err = r.Run(ctx, job("mixed", mixed))
	require.ErrorIs(t, err, backfill.ErrTooManyRejects)
	require.Contains(t, err.Error(), "4 in chunk list:file-1, more than 3 (Config.MaxRejectsPerChunk): 2 before the merge, 2 by the merge")
	require.Contains(t, err.Error(), `events_amount_check`)
	require.Equal(t, backfill.RunFailed, rep.Status)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM events WHERE event_id LIKE 'n%'`))
	require.Zero(t, n)
	require.True(t, strings.HasPrefix(fmt.Sprint(err), "backfill: "))
}

// TestMergeTransientErrorsAreNotRefusals: errors that are not about a row
// (serialization failure, deadlock, lock timeout, statement timeout or
// cancellation), even when a trigger raises them for one row, keep
// failing the chunk (retried: with a one-row Config.LockRetries each wait
// ends its attempt) and queue nothing.
func TestMergeTransientErrorsAreNotRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code     string
		attempts int
	}{{"40001", 2}, {"40P01", 2}, {"55P03", 2}, {"57014", 2}} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			r := refusalNamed("Trigger")
			r.ddl = strings.ReplaceAll(r.ddl, "'BF001'", "'"+tc.code+"'")
			db := refusalSetup(t, refusalModes[0], r)
			run, err := backfill.New(db, &backfill.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond, LockRetries: []backfill.LockRetry{{Timeout: time.Second}}})
			require.NoError(t, err)
			rep, err := run.Run(context.Background(), refusalJob(refusalModes[0], r))
			require.Error(t, err)
			require.Contains(t, err.Error(), "is refused ("+tc.code+")")
			require.NotErrorIs(t, err, backfill.ErrTooManyRejects)
			require.Equal(t, backfill.RunFailed, rep.Status)
			require.Empty(t, exceptionsOf(t, db, rep.BatchID))
			states, err := backfill.NewPGManifest("").Chunks(context.Background(), db, rep.BatchID)
			require.NoError(t, err)
			require.Equal(t, tc.attempts, states[1].Attempts)
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM t WHERE id <= 40`))
			require.Zero(t, n)
		})
	}
}

// TestMergeRefusesKeysOverTheBtreeLimit: a business key of 3,000 bytes
// (random, so incompressible) cannot enter the key's own btree index
// (54000): its row is queued naming the index, the rest of the chunk
// merges, in every keyed mode.
func TestMergeRefusesKeysOverTheBtreeLimit(t *testing.T) {
	t.Parallel()
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.AppendOnly, backfill.History} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, err := db.Exec(`CREATE TABLE k (name text, valid_from int NOT NULL DEFAULT 0, valid_to int, v int, PRIMARY KEY (name, valid_from))`)
			require.NoError(t, err)
			target := backfill.Target{Table: "k", Key: []string{"name", "valid_from"}, Columns: []string{"name", "valid_from", "v"}, Mode: mode}
			if mode == backfill.History {
				target.Key = []string{"name"}
			}
			long := bigText(3000)
			var rows [][]any
			for i := range 10 {
				name := fmt.Sprint("k", i)
				if i == 4 {
					name = long
				}
				rows = append(rows, []any{name, 0, i})
			}
			r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
			require.NoError(t, err)
			job := backfill.Job{Name: "long", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target, Rollback: backfill.RollbackNone}
			rep, err := r.Run(context.Background(), job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 10, Inserted: 9, Rejected: 1}, rep.Counts)
			ex := exceptionsOf(t, db, rep.BatchID)
			require.Len(t, ex, 1)
			require.EqualValues(t, 5, ex[0].Row)
			require.Equal(t, "("+long+", 0)", ex[0].Value)
			require.Contains(t, ex[0].Reason, `exceeds btree version 4 maximum 2704 for index "k_pkey" (SQLSTATE 54000)`)
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM k`))
			require.Equal(t, 9, n)
		})
	}
}

// TestMergeHistoryOpenVersionIndexIsNotARefusal: in History mode a
// unique violation of an index on business key columns only (the
// single-open-version index UNIQUE (key) WHERE valid_to IS NULL) is the
// merge's own invariant, not a bad row: the new version is not queued as
// refused (the chunk fails, or merges, as the History merge decides).
func TestMergeHistoryOpenVersionIndexIsNotARefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE h (id int, valid_from int, valid_to int, v text, PRIMARY KEY (id, valid_from));
		CREATE UNIQUE INDEX h_open ON h (id) WHERE valid_to IS NULL`)
	require.NoError(t, err)
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
	require.NoError(t, err)
	job := func(name string, rows ...[]any) backfill.Job {
		return backfill.Job{Name: name, Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "h", Key: []string{"id"}, Mode: backfill.History}}
	}
	_, err = r.Run(ctx, job("v1", []any{1, 1, "a"}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job("v2", []any{1, 2, "b"}))
	if err == nil {
		require.Zero(t, rep.Counts.Rejected)
		require.Equal(t, backfill.Counts{Read: 1, Inserted: 1}, rep.Counts)
	} else {
		require.Contains(t, err.Error(), `"h_open"`)
		require.Empty(t, exceptionsOf(t, db, rep.BatchID))
	}
}

// TestMergeRefusalsRollBack: a batch whose chunk had rows refused (found
// by bisection, so merged in parts, closing History intervals in several
// statements) rolls back to exactly the table before it, in Upsert and
// History mode.
func TestMergeRefusalsRollBack(t *testing.T) {
	t.Parallel()
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.History} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
				CREATE TABLE t (id int, valid_from int NOT NULL, valid_to int, ref int REFERENCES parent,
					backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (id, valid_from))`)
			require.NoError(t, err)
			target := backfill.Target{Table: "t", Key: []string{"id", "valid_from"}, Columns: []string{"id", "valid_from", "ref"}}
			if mode == backfill.History {
				target = backfill.Target{Table: "t", Key: []string{"id"}, Mode: mode, Columns: []string{"id", "valid_from", "ref"}}
			}
			job := func(rows [][]any) backfill.Job {
				return backfill.Job{Name: "rb", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target, NewRun: true}
			}
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			var first, second [][]any
			for id := 1; id <= 20; id++ {
				first = append(first, []any{id, 1, id % 10})
				// Batch 2: a changed version 1 (Upsert) and versions 2 and 3
				// of every id; a foreign key refuses some.
				for vf := 1; vf <= 3; vf++ {
					ref := (id + vf) % 10
					if (id*3+vf)%11 == 0 {
						ref = 99
					}
					second = append(second, []any{id, vf, ref})
				}
			}
			_, err = r.Run(ctx, job(first))
			require.NoError(t, err)
			before := tableDump(t, db)
			rep, err := r.Run(ctx, job(second))
			require.NoError(t, err)
			require.Positive(t, rep.Counts.Rejected)
			require.True(t, rep.Counts.Balanced())
			require.NotEqual(t, before, tableDump(t, db))
			_, err = r.Rollback(ctx, job(second), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ann", Why: "test"})
			require.NoError(t, err)
			require.Equal(t, before, tableDump(t, db))
		})
	}
}

// TestMergeRefusalsWithUnchangedDeliveries: a replay by a new batch whose
// chunk the target refuses rows of (a foreign key, found by bisection, so
// the chunk merges in parts) records the rows it delivered unchanged for
// every part, and they still protect the first batch's rows from its
// rollback.
func TestMergeRefusalsWithUnchangedDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 9);
		CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent,
			backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	target := backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "ref"}}
	job := func(rows [][]any) backfill.Job {
		return backfill.Job{Name: "deliv", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...), Target: target,
			NewRun: true, MaxRunRejectRate: -1}
	}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	var first, second [][]any
	for id := 1; id <= 64; id++ {
		first = append(first, []any{id, id % 10})
		second = append(second, []any{id, id % 10}) // unchanged
	}
	for id := 65; id <= 68; id++ {
		second = append(second, []any{id, 99}) // refused by the foreign key
	}
	rep1, err := r.Run(ctx, job(first))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(second))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 68, Unchanged: 64, Rejected: 4}, rep2.Counts)
	var parts int
	require.NoError(t, db.Get(&parts, `SELECT count(*) FROM backfill.delivered WHERE owner = $1 AND batch_id = $2`, rep1.BatchID, rep2.BatchID))
	require.Greater(t, parts, 1, "the chunk merged in parts, each recording its deliveries")
	_, err = r.Rollback(ctx, job(first), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "test"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM t`))
	require.Equal(t, 64, n)
}
