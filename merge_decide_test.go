package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// waitBlocked waits until a backend of db's database waits for a lock
// (the merge under test, behind a row another transaction holds).
func waitBlocked(t *testing.T, db *sqlx.DB, done chan error) {
	t.Helper()
	for range 600 {
		select {
		case err := <-done:
			t.Fatalf("the merge ended without waiting for a lock: %v", err)
		default:
		}
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`))
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no backend waits for a lock")
}

// TestMergeDecidesUnderTheRowLock: a merge whose target row another
// transaction holds decides from that transaction's committed row, not
// from a snapshot taken before it waited: through a partition and its
// partitioned parent (the key locks are shared), against an application's
// uncommitted UPDATE (NewerVersionWins keeps the higher version), and the
// undo log's "before" image is the row the merge overwrote.
func TestMergeDecidesUnderTheRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nvw := backfill.Target{Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "version"}

	t.Run("partition and parent", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(`CREATE TABLE p (id bigint, name text, version bigint, PRIMARY KEY (id)) PARTITION BY RANGE (id);
			CREATE TABLE p0 PARTITION OF p FOR VALUES FROM (0) TO (1000);
			INSERT INTO p VALUES (1, 'v1', 1)`)
		m := pgstore.NewMerger()
		tg := nvw
		tg.Table = "p"
		infoP, err := m.Prepare(ctx, db, tg)
		require.NoError(t, err)
		tg.Table = "p0"
		infoC, err := m.Prepare(ctx, db, tg)
		require.NoError(t, err)
		tx1, _, err := mergeInTx(t, db, m, infoP, []any{int64(1), "v5", int64(5)})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			tx2, _, err := mergeInTx(t, db, m, infoC, []any{int64(1), "v3", int64(3)})
			if err == nil {
				err = tx2.Commit()
			} else {
				_ = tx2.Rollback()
			}
			done <- err
		}()
		waitBlocked(t, db, done)
		require.NoError(t, tx1.Commit())
		require.NoError(t, <-done)
		var name string
		require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
		require.Equal(t, "v5", name, "a lower version overwrote the higher one")
	})

	// run merges rows into p while an application transaction holds key 1
	// with update, and returns the runner and job after both committed.
	run := func(t *testing.T, db *sqlx.DB, update string, tg backfill.Target, rb backfill.RollbackMechanism, row []any) (*backfill.Runner, backfill.Job) {
		app, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		_, err = app.Exec(update)
		require.NoError(t, err)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		job := backfill.Job{Name: "j", Chunker: backfill.List("a"), Extractor: rowsFunc(row), Target: tg, Rollback: rb}
		done := make(chan error, 1)
		go func() { _, err := r.Run(ctx, job); done <- err }()
		waitBlocked(t, db, done)
		require.NoError(t, app.Commit())
		require.NoError(t, <-done)
		return r, job
	}
	t.Run("external writer", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		db.MustExec(`CREATE TABLE p (id bigint PRIMARY KEY, name text, version bigint); INSERT INTO p VALUES (1, 'v1', 1)`)
		tg := nvw
		tg.Table = "p"
		run(t, db, `UPDATE p SET name = 'app10', version = 10 WHERE id = 1`, tg, backfill.RollbackNone, []any{int64(1), "v5", int64(5)})
		var name string
		require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
		require.Equal(t, "app10", name, "version 5 overwrote version 10")
	})
	for _, mode := range []backfill.Mode{backfill.Upsert, backfill.History} {
		t.Run("undo image "+string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			db.MustExec(`CREATE TABLE p (id bigint, valid_from date NOT NULL DEFAULT '2024-01-01', valid_to date, name text,
				backfill_inserted_by bigint, backfill_updated_by bigint, UNIQUE (id, valid_from), UNIQUE (id));
				INSERT INTO p (id, name) VALUES (1, 'orig')`)
			tg := backfill.Target{Table: "p", Key: []string{"id"}, Columns: []string{"id", "valid_from", "name"}, Mode: mode}
			r, job := run(t, db, `UPDATE p SET name = 'app' WHERE id = 1`, tg, "", []any{int64(1), "2024-01-01", "backfill"})
			var name string
			require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
			require.Equal(t, "backfill", name)
			_, err := r.Rollback(ctx, job, backfill.RollbackOptions{Actor: "a", Why: "t"})
			require.NoError(t, err)
			require.NoError(t, db.Get(&name, `SELECT name FROM p WHERE id = 1`))
			require.Equal(t, "app", name, "rollback restored an image older than the one the batch overwrote")
		})
	}
}

// refuseRun runs rows (id, ref) into table t created by ddl and returns
// the report, the ids left in t and the run's error.
func refuseRun(t *testing.T, ddl string, rows ...[]any) (backfill.Report, []int, error) {
	db := pgtest.New(t)
	db.MustExec(ddl)
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 2})
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), backfill.Job{Name: "j", Chunker: backfill.List("a"), Extractor: rowsFunc(rows...),
		Rollback: backfill.RollbackNone, MaxRunRejectRate: -1, Target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "ref"}}})
	var ids []int
	require.NoError(t, db.Select(&ids, `SELECT id FROM t ORDER BY id`))
	return rep, ids, err
}

var fiveRefs = [][]any{{1, 1}, {2, 2}, {3, 999}, {4, 4}, {5, 5}}

// TestMergeDeferredConstraintsRefuseTheRow: a deferred foreign key or
// constraint trigger refuses its row at merge time, like an immediate
// one, instead of failing the chunk at COMMIT; so does one referencing
// the target (a deferred foreign key of another table checked on delete
// is out of reach of a merge, which does not delete). Deferred checks a
// merge queues elsewhere, through a trigger writing to another table,
// or of a deferrable foreign key created after Prepare, fire there too.
func TestMergeDeferredConstraintsRefuseTheRow(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string]string{
		"foreign key": `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 10);
			CREATE TABLE t (id int PRIMARY KEY, ref int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`,
		"constraint trigger": `CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.ref = 999 THEN RAISE EXCEPTION 'bad ref %', NEW.ref; END IF; RETURN NULL; END $$;
			CREATE CONSTRAINT TRIGGER ct AFTER INSERT OR UPDATE ON t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION f()`,
		"trigger writing another table": `CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(0, 10);
			CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE TABLE audit (ref int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.ref); RETURN NULL; END $$;
			CREATE TRIGGER tg AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f()`,
		"deferred check on another table": `CREATE TABLE t (id int PRIMARY KEY, ref int);
			CREATE TABLE audit (ref int);
			CREATE FUNCTION g() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.ref = 999 THEN RAISE EXCEPTION 'bad ref %', NEW.ref; END IF; RETURN NULL; END $$;
			CREATE CONSTRAINT TRIGGER ct AFTER INSERT ON audit DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION g();
			CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO audit VALUES (NEW.ref); RETURN NULL; END $$;
			CREATE TRIGGER tg AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION f()`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rep, ids, err := refuseRun(t, ddl, fiveRefs...)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 5, Inserted: 4, Rejected: 1}, rep.Counts)
			require.Equal(t, []int{1, 2, 4, 5}, ids)
		})
	}
}

// TestMergeStatementTriggerFailsTheChunk: a statement-level trigger that
// raises refuses the statement, not a row: the chunk fails with an error
// naming the trigger, and no row is queued as refused.
func TestMergeStatementTriggerFailsTheChunk(t *testing.T) {
	t.Parallel()
	rep, ids, err := refuseRun(t, `CREATE TABLE t (id int PRIMARY KEY, ref int);
		CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'table t is frozen for maintenance'; END $$;
		CREATE TRIGGER st BEFORE INSERT OR UPDATE ON t FOR EACH STATEMENT EXECUTE FUNCTION f()`, fiveRefs...)
	require.Error(t, err)
	require.ErrorContains(t, err, `statement-level trigger "st"`)
	require.Zero(t, rep.Counts.Rejected, "rows were queued as refused although no row was at fault")
	require.Empty(t, ids)
}

// TestRollbackNotNullDomain: rollback and its preview work on a target
// with a NOT NULL domain column (the logged key is not read back as a
// whole target row, whose other columns would be NULL).
func TestRollbackNotNullDomain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE DOMAIN nn_text AS text NOT NULL;
		CREATE TABLE t (id bigint PRIMARY KEY, name nn_text, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(rows map[int64]string) backfill.Job {
		return backfill.Job{Name: "j", NewRun: true, Chunker: backfill.IntRange(0, 10, 5), ChunkColumn: "id",
			Extractor: dlvExtractor(rows, func(ctx context.Context, w backfill.RowWriter, id int64, n string) error { return w.Write(ctx, id, n) }),
			Target:    backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "name"}}}
	}
	rep1, err := r.Run(ctx, job(map[int64]string{1: "same", 2: "old"}))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(map[int64]string{1: "same", 2: "new", 3: "x"}))
	require.NoError(t, err)
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep1.BatchID, Preview: true})
	require.NoError(t, err, "preview of batch 1")
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep2.BatchID, ChunkID: "int:0/5", Actor: "a", Why: "t"})
	require.NoError(t, err, "rollback of one chunk of batch 2")
	_, err = r.Rollback(ctx, job(nil), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "a", Why: "t"})
	require.NoError(t, err, "rollback of batch 2")
	var got []string
	require.NoError(t, db.Select(&got, `SELECT id || '=' || name FROM t ORDER BY id`))
	require.Equal(t, []string{"1=same", "2=old"}, got)
}

// looseSetup creates the types of looseCases.
const looseSetup = `CREATE COLLATION IF NOT EXISTS ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
	CREATE EXTENSION IF NOT EXISTS citext;
	CREATE DOMAIN nd AS numeric; CREATE DOMAIN nd2 AS nd; CREATE DOMAIN fd AS float8; CREATE DOMAIN jd AS jsonb;
	CREATE DOMAIN jda AS jsonb[]; CREATE DOMAIN idd AS interval; CREATE DOMAIN cit AS text COLLATE ci; CREATE DOMAIN cit2 AS cit`

// looseCases are values equal by their type's equality but stored
// differently: numeric scale, float -0, interval units, jsonb numbers,
// arrays and ranges of them, a nondeterministic collation; domains over
// them (of any depth), arrays of those domains, domains over arrays; an
// extension type (citext) and arrays of it.
var looseCases = []struct{ typ, old, new string }{
	{"nd[]", "{1.0}", "{1.00}"},
	{"nd2", "1.0", "1.00"},
	{"nd2[]", "{1.0}", "{1.00}"},
	{"fd[]", "{0}", "{-0}"},
	{"jd[]", `{"{\"a\": 1.0}"}`, `{"{\"a\": 1.00}"}`},
	{"jda", `{"{\"a\": 1.0}"}`, `{"{\"a\": 1.00}"}`},
	{"idd[]", "{1 day}", "{24 hours}"},
	{"citext", "abc", "ABC"},
	{"citext[]", "{abc}", "{ABC}"},
	{"cit", "abc", "ABC"},
	{"cit[]", "{abc}", "{ABC}"},
	{"cit2[]", "{abc}", "{ABC}"},
	{"text[] COLLATE ci", "{abc}", "{ABC}"},
	{"bpchar", "a", "a "},
	{"bpchar COLLATE ci", "a", "A "},
	{"numeric", "1.0", "1.00"},
	{"double precision", "0", "-0"},
	{"real", "0", "-0"},
	{"interval", "1 day", "24 hours"},
	{"interval", "1 mon", "30 days"},
	{"jsonb", `{"a": 1.0}`, `{"a": 1.00}`},
	{"text COLLATE ci", "abc", "ABC"},
	{"numeric[]", "{1.0}", "{1.00}"},
	{"numrange", "[1.0,2)", "[1.00,2)"},
}

// looseJob writes v as column v of key 0 into table name.
func looseJob(name, v string, checks ...backfill.Validator) backfill.Job {
	return backfill.Job{Name: name, NewRun: true, Chunker: backfill.IntRange(0, 1, 1), Validators: checks, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: name, Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, _ backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, int64(0), v)
		})}
}

// TestMergeComparesExactly: a restatement that only changes how a value
// is stored (looseCases) updates the row, and a replay after that
// changes nothing.
func TestMergeComparesExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(looseSetup)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for i, c := range looseCases {
		name := fmt.Sprintf("eq_%d", i)
		db.MustExec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, v %s)`, name, c.typ))
		_, err = r.Run(ctx, looseJob(name, c.old))
		require.NoError(t, err)
		rep, err := r.Run(ctx, looseJob(name, c.new))
		require.NoError(t, err)
		require.Equal(t, int64(1), rep.Counts.Updated, "%s: restating %q over %q", c.typ, c.new, c.old)
		var got, want string
		require.NoError(t, db.Get(&got, fmt.Sprintf(`SELECT v::text FROM %s`, name)))
		require.NoError(t, db.Get(&want, fmt.Sprintf(`SELECT $1::%s::text`, c.typ), c.new))
		require.Equal(t, want, got, c.typ)
		rep, err = r.Run(ctx, looseJob(name, c.new))
		require.NoError(t, err)
		require.Equal(t, int64(1), rep.Counts.Unchanged, "%s: replay", c.typ)
	}
}

// TestChecksCompareExactly: every check that compares content (and the
// fingerprints they use) fails when the target holds another form of the
// value written (looseCases; a trigger stores the old form).
func TestChecksCompareExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(looseSetup)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for i, c := range looseCases {
		name := fmt.Sprintf("eq_%d", i)
		db.MustExec(fmt.Sprintf(`CREATE TABLE %[1]s (id bigint PRIMARY KEY, v %[3]s);
			CREATE FUNCTION %[1]s_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.v := %[2]s::%[3]s; RETURN NEW; END $$;
			CREATE TRIGGER %[1]s_tg BEFORE INSERT OR UPDATE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_f()`,
			name, pqLiteral(c.old), c.typ))
		for _, v := range []backfill.Validator{backfill.Sample{}, backfill.Completeness{CompareContent: true}, backfill.ReplayChangesNothing{}} {
			db.MustExec(`TRUNCATE ` + name)
			_, err = r.Run(ctx, looseJob(name, c.new, v))
			require.True(t, errors.Is(err, backfill.ErrGateFailed), "%s: %T passed with %q stored for %q: %v", c.typ, v, c.old, c.new, err)
		}
	}
}

// pqLiteral quotes s as an SQL string literal.
func pqLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
