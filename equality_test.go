package backfill_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// equalityChecks are the checks that compare a chunk's staged rows with
// its target rows, each at its strictest.
func equalityChecks() []backfill.Validator {
	return []backfill.Validator{
		backfill.Completeness{CompareContent: true},
		backfill.Completeness{Name: "completeness_exact", CompareContent: true, Exact: true},
		backfill.Sample{N: 1000},
		backfill.ReplayChangesNothing{},
		backfill.ReplayChangesNothing{Name: "replay_exact", Exact: true},
		backfill.Aggregates{Exact: true},
		backfill.DuplicateKeys{},
	}
}

// TestHashColumnFollowsTheEqualityRule: with Target.HashColumn the merge
// judges a replay as it does without one, by the stored form of each
// value: numeric 1.50 for 1.5 in an unconstrained numeric and -0 for 0
// are changes (the merge updates the row, and the checks then pass),
// 1.50 for 15.0e-1 is not. The verdicts are those of the same target
// without a hash column.
func TestHashColumnFollowsTheEqualityRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE hashed (sku text PRIMARY KEY, price numeric, qty float8, row_hash bytea NOT NULL);
		CREATE TABLE plain (sku text PRIMARY KEY, price numeric, qty float8)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	run := func(table, price string, qty float64) backfill.Counts {
		t.Helper()
		target := backfill.Target{Table: table, Key: []string{"sku"}, Columns: []string{"sku", "price", "qty"}}
		if table == "hashed" {
			target.HashColumn = "row_hash"
		}
		rep, err := r.Run(ctx, backfill.Job{Name: table, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
			Extractor: rowsFunc([]any{"a", price, qty}, []any{"b", "2", 1.0}), Target: target, Validators: equalityChecks()})
		require.NoError(t, err, "%s: price %s, qty %v", table, price, qty)
		return rep.Counts
	}
	negZero := func() float64 { z := 0.0; return -z }()
	for _, table := range []string{"plain", "hashed"} {
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(table, "1.5", 0))
		require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, run(table, "1.50", 0), "%s: 1.50 for 1.5", table)
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(table, "15.0e-1", 0), "%s: 15.0e-1 for 1.50", table)
		require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, run(table, "15.0e-1", negZero), "%s: -0 for 0", table)
	}
}

// TestRespelledKeysAreTheSameRow: a replay whose business keys are
// spelled otherwise (numeric 1.00 for 1.0, a timestamptz in another zone,
// an upper-case uuid, another case under a case-insensitive collation)
// finds the rows it loaded: the merge leaves them unchanged, and every
// check agrees that they are present with the same content.
func TestRespelledKeysAreTheSameRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE keyed (n numeric, at timestamptz, u uuid, k text COLLATE ci, v text, row_hash bytea,
			PRIMARY KEY (n, at, u, k))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for _, hash := range []string{"", "row_hash"} {
		_, err := db.Exec(`TRUNCATE keyed`)
		require.NoError(t, err)
		run := func(rows ...[]any) backfill.Counts {
			t.Helper()
			rep, err := r.Run(ctx, backfill.Job{Name: "keyed" + hash, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc(rows...), Validators: equalityChecks(),
				Target: backfill.Target{Table: "keyed", Key: []string{"n", "at", "u", "k"}, Columns: []string{"n", "at", "u", "k", "v"}, HashColumn: hash}})
			require.NoError(t, err, "hash column %q", hash)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(
			[]any{"1.0", "2024-03-01T10:00:00Z", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "abc", "x"},
			[]any{"2", "2024-03-01T11:00:00Z", "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", "Def", "y"}))
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(
			[]any{"1.00", "2024-03-01T12:00:00+02:00", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "ABC", "x"},
			[]any{"2e0", "2024-03-01T06:00:00-05:00", "{b0eebc999c0b4ef8bb6d6bb9bd380a12}", "dEF", "y"}), "hash column %q", hash)
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM keyed`))
		require.Equal(t, 2, n)
	}
}

// TestKeylessHashColumnIgnoresDeriveSources: in Keyless mode the raw
// sources of derived keys are not content (rows that differ only there
// are one record), so the row hash leaves them out: a replay that spells
// a name otherwise (" ACME " for "Acme", one derived key) is unchanged
// with a hash column as without one, never an ambiguous key.
func TestKeylessHashColumnIgnoresDeriveSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE legacy (name_key text PRIMARY KEY, name text, city text, row_hash bytea);
		CREATE TABLE legacy_plain (name_key text PRIMARY KEY, name text, city text)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for _, table := range []string{"legacy_plain", "legacy"} {
		run := func(name, city string) backfill.Counts {
			t.Helper()
			target := backfill.Target{Table: table, Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "city"},
				Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}}
			if table == "legacy" {
				target.HashColumn = "row_hash"
			}
			rep, err := r.Run(ctx, backfill.Job{Name: table, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc([]any{name, city}), Target: target, Validators: equalityChecks()})
			require.NoError(t, err, table)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 1, Inserted: 1}, run("Acme", "Oslo"), table)
		require.Equal(t, backfill.Counts{Read: 1, Unchanged: 1}, run(" ACME ", "Oslo"), "%s: another spelling of the derived key's source", table)
	}
}

// TestAggregatesGroupsByStoredValue: Aggregates groups its Dimensions by
// the stored value, as the merge compares content: under TargetWins a
// staged row that lost to a target row whose dimension holds another
// stored form of an equal value (numeric 1.50 for 1.5, float -0 for 0,
// interval '24 hours' for '1 day') shows up as a difference, and a
// respelling of the same stored value (15e-1 for 1.5) does not.
func TestAggregatesGroupsByStoredValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE dims (id int PRIMARY KEY, grp numeric, f float8, iv interval)`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "dims", Key: []string{"id"}, Conflict: backfill.TargetWins})
	require.NoError(t, err)
	stage := func(tx *sqlx.Tx, row ...any) backfilldriver.Stager {
		st, err := m.Stage(ctx, tx, info)
		require.NoError(t, err)
		require.NoError(t, st.Add(ctx, 1, row))
		_, err = st.Merge(ctx)
		require.NoError(t, err)
		return st
	}
	tx, err := db.Beginx()
	require.NoError(t, err)
	require.NoError(t, stage(tx, 1, "1.5", 0.0, "1 day").Close())
	require.NoError(t, tx.Commit())
	for _, c := range []struct {
		dim    string
		row    []any
		passed bool
	}{
		{"grp", []any{1, "15e-1", 0.0, "1 day"}, true},
		{"grp", []any{1, "1.50", 0.0, "1 day"}, false},
		{"f", []any{1, "1.5", math.Copysign(0, -1), "1 day"}, false},
		{"iv", []any{1, "1.5", 0.0, "24 hours"}, false},
		{"iv", []any{1, "1.5", 0.0, "P1D"}, true},
	} {
		tx, err := db.Beginx()
		require.NoError(t, err)
		st := stage(tx, c.row...)
		res, err := backfill.Aggregates{Dimensions: []string{c.dim}, Exact: true}.Validate(ctx, tx, backfill.ValidationScope{
			Chunk: backfill.Chunk{ID: "list:all", Kind: backfilltype.KindList, Item: "all"}, Info: info,
			Staging: st.(backfilldriver.StagingTabler).StagingTable(), Stager: st})
		require.NoError(t, err)
		require.Equal(t, c.passed, res.Passed, "%s %v: %s %v", c.dim, c.row, res.Actual, res.Sample)
		require.NoError(t, st.Close())
		require.NoError(t, tx.Rollback())
	}
}

// TestHistoryRespelledIdentityIsTheSameVersion: in History mode the
// identity is Key plus ValidFrom; a replay that spells both otherwise (the
// customer in another case under a case-insensitive collation, valid_from
// in another zone, the amount respelled with its scale) finds every
// version: no version is added or closed, nothing changes, and every
// check agrees, with a hash column as without one.
func TestHistoryRespelledIdentityIsTheSameVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE addr (customer text COLLATE ci, valid_from timestamptz, valid_to timestamptz, city text, amount numeric,
			row_hash bytea, PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	at := time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)
	east := time.FixedZone("", 2*3600)
	for _, hash := range []string{"", "row_hash"} {
		_, err := db.Exec(`TRUNCATE addr`)
		require.NoError(t, err)
		run := func(rows ...[]any) backfill.Counts {
			t.Helper()
			rep, err := r.Run(ctx, backfill.Job{Name: "addr" + hash, Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
				Extractor: rowsFunc(rows...), Validators: equalityChecks(),
				Target: backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History,
					Columns: []string{"customer", "valid_from", "city", "amount"}, HashColumn: hash}})
			require.NoError(t, err, "hash column %q", hash)
			return rep.Counts
		}
		require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(
			[]any{"acme", at, "Oslo", "1.5"}, []any{"acme", at.AddDate(0, 1, 0), "Bergen", "2.0"}))
		require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(
			[]any{"ACME", at.In(east), "Oslo", "15e-1"}, []any{"Acme", at.AddDate(0, 1, 0).Format(time.RFC3339), "Bergen", "0.20e1"}),
			"hash column %q", hash)
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM addr`))
		require.Equal(t, 2, n)
	}
}

// TestRollbackFindsRespelledKeys: the undo log records a key as the replay
// spelled it (numeric 1.00, a timestamptz in another zone, an upper-case
// uuid, another case under a case-insensitive collation); rollback looks
// the rows up by the same rule as the merge and restores them.
func TestRollbackFindsRespelledKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE keyed (n numeric, at timestamptz, u uuid, k text COLLATE ci, v text,
			backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (n, at, u, k))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(rows ...[]any) backfill.Job {
		return backfill.Job{Name: "keyed", Chunker: backfill.List("all"), NewRun: true, Extractor: rowsFunc(rows...), Validators: equalityChecks(),
			Target: backfill.Target{Table: "keyed", Key: []string{"n", "at", "u", "k"}, Columns: []string{"n", "at", "u", "k", "v"}}}
	}
	at := time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)
	_, err = r.Run(ctx, job([]any{"1.0", at, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "abc", "x"}))
	require.NoError(t, err)
	rep, err := r.Run(ctx, job([]any{"1.00", at.In(time.FixedZone("", 3600)), "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "ABC", "changed"}))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1, Updated: 1}, rep.Counts)
	rb, err := r.Rollback(ctx, job(), backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "test", Why: "respelled keys"})
	require.NoError(t, err)
	require.Equal(t, int64(1), rb.Restored)
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT n || ' ' || k || ' ' || v FROM keyed`))
	require.Equal(t, []string{"1.0 abc x"}, rows)
}

// TestAggregatesGroupsKeysByTheTargetRow: a Dimension that is a key column
// groups a staged row under the key its target row stores (the package
// documentation's "Equality": the target keeps the key as first stored), so
// a replay that spells the key otherwise (numeric 1.00 for 1.0, the instant
// in another zone, an upper-case uuid, another case under a case-insensitive
// collation or in citext) passes, as does a chunk that repeats a row with
// its key spelled otherwise, which the merge deduplicates. The Day of a
// timestamptz key in another zone is the same instant's day.
func TestAggregatesGroupsKeysByTheTargetRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS citext;
		CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		CREATE TABLE eq_t (k numeric, at timestamptz, id uuid, c text COLLATE ci, ct citext, amt numeric, note text, h bytea,
			UNIQUE (k, at, id, c, ct))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	at := time.Date(2024, 3, 1, 23, 30, 0, 0, time.UTC)
	east := time.FixedZone("", 5*3600)
	u := "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	loaded := []any{"1.0", at, u, "abc", "Xyz", "1.5", "n"}
	respelled := []any{"1.00", at.In(east), strings.ToUpper(u), "ABC", "xYZ", "1.5", "n"}
	other := []any{"2", at.Add(-time.Hour), "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12", "def", "uvw", "2.5", "m"}
	for _, dims := range [][]string{{"note"}, {"k"}, {"k", "id"}, {"c", "ct", "at"}, {"k", "at", "id", "c", "ct", "note"}} {
		for _, hash := range []string{"", "h"} {
			_, err := db.Exec(`TRUNCATE eq_t`)
			require.NoError(t, err)
			run := func(rows ...[]any) backfill.Counts {
				t.Helper()
				rep, err := r.Run(ctx, backfill.Job{Name: "eq_t", NewRun: true, Rollback: backfill.RollbackNone,
					Chunker: backfill.Days(at.Truncate(24*time.Hour), at.Truncate(24*time.Hour).AddDate(0, 0, 1), time.UTC), ChunkColumn: "at",
					Extractor: rowsFunc(rows...),
					Validators: []backfill.Validator{
						backfill.Aggregates{Day: "at", Dimensions: dims, Measures: []backfill.Measure{{Column: "amt"}}},
						backfill.Aggregates{Name: "aggregates_exact", Day: "at", Dimensions: dims, Measures: []backfill.Measure{{Column: "amt"}}, Exact: true},
					},
					Target: backfill.Target{Table: "eq_t", Key: []string{"k", "at", "id", "c", "ct"}, HashColumn: hash,
						Columns: []string{"k", "at", "id", "c", "ct", "amt", "note"}}})
				require.NoError(t, err, "dimensions %v, hash column %q", dims, hash)
				return rep.Counts
			}
			require.Equal(t, backfill.Counts{Read: 2, Inserted: 2}, run(loaded, other))
			require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, run(respelled, other), "dimensions %v, hash column %q: the replay", dims, hash)
			require.Equal(t, backfill.Counts{Read: 3, Unchanged: 2, Deduplicated: 1}, run(loaded, respelled, other),
				"dimensions %v, hash column %q: a row repeated with its key spelled otherwise", dims, hash)
			_, err = db.Exec(`TRUNCATE eq_t`)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 3, Inserted: 2, Deduplicated: 1}, run(respelled, other, loaded),
				"dimensions %v, hash column %q: a first load that repeats a row with its key spelled otherwise", dims, hash)
		}
	}
}
