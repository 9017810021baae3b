package backfill_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func rowsFunc(rows ...[]any) backfill.Extractor {
	return backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for _, r := range rows {
			if err := w.Write(ctx, r...); err != nil {
				return err
			}
		}
		return nil
	})
}

func exceptionsOf(t *testing.T, db *sqlx.DB, batch int64) []backfill.Exception {
	t.Helper()
	ex, err := backfill.NewPGManifest("").Exceptions(context.Background(), db, batch)
	require.NoError(t, err)
	return ex
}

func TestAppendOnlyConflictingReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE events (event_id text PRIMARY KEY, kind text NOT NULL, amount numeric(10,2))`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := backfill.Job{Name: "events", Chunker: backfill.List("file-1"), MaxRunRejectRate: -1,
		Extractor: rowsFunc([]any{"e1", "sale", "10.00"}, []any{"e2", "refund", "-5.00"}),
		Rollback:  backfill.RollbackNone,
		Target:    backfill.Target{Table: "events", Key: []string{"event_id"}, Mode: backfill.AppendOnly}}
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	var before []string
	require.NoError(t, db.Select(&before, `SELECT row(e.*, xmin)::text FROM events e ORDER BY event_id`))

	// The same file again, but e2 now says something else.
	job.NewRun = true
	job.Extractor = rowsFunc([]any{"e1", "sale", "10.0"}, []any{"e2", "refund", "-7.50"})
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Unchanged: 1, Rejected: 1}, rep.Counts, "10.0 equals 10.00; e2 conflicts")
	var after []string
	require.NoError(t, db.Select(&after, `SELECT row(e.*, xmin)::text FROM events e ORDER BY event_id`))
	require.Equal(t, before, after, "target unchanged")
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 1)
	require.Equal(t, "(e2)", ex[0].Value)
	require.Equal(t, "amount", ex[0].Column)
	require.Equal(t, int64(2), ex[0].Row)
	require.Contains(t, ex[0].Reason, "conflicting content for existing event: amount differ")
	require.JSONEq(t, `{"staged": {"event_id": "e2", "kind": "refund", "amount": -7.50}, "existing": {"event_id": "e2", "kind": "refund", "amount": -5.00}}`, string(ex[0].Raw))
}

func TestKeylessDerivesKeysAndQueuesAmbiguity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE customers (customer_key text PRIMARY KEY, name text, city text)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := backfill.Job{Name: "legacy", Chunker: backfill.List("customers.csv"), MaxRunRejectRate: -1,
		Extractor: rowsFunc(
			[]any{"  Zoë  Müller", "Oslo"},
			[]any{"ZOE\u0308 MÜLLER", "Oslo"}, // same person: identical content after normalisation
			[]any{"Bob Stone", "Rome"},
			[]any{"bob  stone ", "Paris"}, // same derived key, other city: ambiguous
			[]any{nil, "Lima"},            // no name: no key
			[]any{"Ann", nil},
		),
		Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "customers", Key: []string{"customer_key"}, Mode: backfill.Keyless,
			Columns: []string{"name", "city"},
			Derive: []backfill.KeyRule{{Column: "customer_key", From: "name",
				Rules: []backfill.Normalizer{backfill.Trim, backfill.CollapseSpace, backfill.NFC, backfill.CaseFold}}}}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 6, Inserted: 2, Deduplicated: 1, Rejected: 3}, rep.Counts)
	var got [][2]string
	rows, err := db.Query(`SELECT customer_key, name FROM customers ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var k, n string
		require.NoError(t, rows.Scan(&k, &n))
		got = append(got, [2]string{k, n})
	}
	require.Equal(t, [][2]string{{"ann", "Ann"}, {"zoë müller", "  Zoë  Müller"}}, got)
	ex := exceptionsOf(t, db, rep.BatchID)
	require.Len(t, ex, 3)
	var reasons []string
	for _, e := range ex {
		reasons = append(reasons, fmt.Sprintf("%d %s: %s", e.Row, e.Column, e.Reason))
	}
	require.Equal(t, []string{
		"3 city: ambiguous derived key: rows 3 and others share it with different content",
		"4 city: ambiguous derived key: rows 3 and others share it with different content",
		`5 customer_key: missing key column: NULL in "name", the source of derived key "customer_key"`,
	}, reasons)
}

func TestHashColumnDetectsChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE prices (sku text PRIMARY KEY, price numeric(12,4), note text, row_hash bytea NOT NULL)`)
	require.NoError(t, err)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := func(price string, newRun bool) backfill.Job {
		return backfill.Job{Name: "prices", Chunker: backfill.List("all"), NewRun: newRun,
			Extractor: rowsFunc([]any{"a", price, nil}, []any{"b", "2", "x"}),
			Rollback:  backfill.RollbackNone,
			Target:    backfill.Target{Table: "prices", Key: []string{"sku"}, HashColumn: "row_hash"}}
	}
	rep, err := r.Run(ctx, job("1.5", false))
	require.NoError(t, err)
	require.Equal(t, int64(2), rep.Counts.Inserted)
	var h1 []byte
	require.NoError(t, db.Get(&h1, `SELECT row_hash FROM prices WHERE sku = 'a'`))
	require.Len(t, h1, 32)
	rep, err = r.Run(ctx, job("1.500", true))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Unchanged: 2}, rep.Counts, "1.5 and 1.500 hash alike")
	rep, err = r.Run(ctx, job("1.6", true))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 2, Updated: 1, Unchanged: 1}, rep.Counts)
	var h2 []byte
	require.NoError(t, db.Get(&h2, `SELECT row_hash FROM prices WHERE sku = 'a'`))
	require.NotEqual(t, h1, h2)
}

// TestHistoryIntervalsTile checks SCD2 after random sequences of versions,
// late ones and exact repeats included: per key the intervals tile its
// history (valid_to = next valid_from, the last open), and the current row
// is the newest version.
func TestHistoryIntervalsTile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE addr (customer text, valid_from timestamptz, valid_to timestamptz, city text,
		PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, err)
	m := pgstore.NewMerger()
	info, err := m.Prepare(ctx, db, backfill.Target{Table: "addr", Key: []string{"customer"}, Mode: backfill.History})
	require.NoError(t, err)
	base := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	rapid.Check(t, func(rt *rapid.T) {
		_, err := db.Exec(`TRUNCATE addr`)
		require.NoError(rt, err)
		latest := map[string]time.Time{}
		for b := range rapid.IntRange(1, 6).Draw(rt, "batches") {
			tx, err := db.Beginx()
			require.NoError(rt, err)
			st, err := m.Stage(ctx, tx, info)
			require.NoError(rt, err)
			for i := range rapid.IntRange(0, 5).Draw(rt, "versions") {
				c := fmt.Sprintf("c%d", rapid.IntRange(0, 2).Draw(rt, "customer"))
				vf := base.Add(time.Duration(rapid.IntRange(0, 20).Draw(rt, "hour")) * time.Hour)
				city := fmt.Sprintf("city-%s-%d", c, vf.Hour()) // content is a function of the version
				if vf.After(latest[c]) {
					latest[c] = vf
				}
				require.NoError(rt, st.Add(ctx, int64(b*10+i+1), []any{c, vf.Format(time.RFC3339), city}))
			}
			_, err = st.Merge(ctx)
			require.NoError(rt, err)
			require.NoError(rt, tx.Commit())
		}
		type version struct {
			Customer  string     `db:"customer"`
			ValidFrom time.Time  `db:"valid_from"`
			ValidTo   *time.Time `db:"valid_to"`
		}
		var vs []version
		require.NoError(rt, db.Select(&vs, `SELECT customer, valid_from, valid_to FROM addr ORDER BY customer, valid_from`))
		for i, v := range vs {
			last := i == len(vs)-1 || vs[i+1].Customer != v.Customer
			if last {
				require.Nil(rt, v.ValidTo, "the current version of %s is open", v.Customer)
				require.True(rt, v.ValidFrom.Equal(latest[v.Customer]), "the current version of %s is the newest", v.Customer)
				continue
			}
			require.NotNil(rt, v.ValidTo)
			require.True(rt, v.ValidTo.Equal(vs[i+1].ValidFrom), "%s: [%s, %s) then %s", v.Customer, v.ValidFrom, v.ValidTo, vs[i+1].ValidFrom)
		}
		require.Len(rt, latest, countDistinct(vs, func(v version) string { return v.Customer }))
	})
}

func countDistinct[T any](xs []T, key func(T) string) int {
	m := map[string]bool{}
	for _, x := range xs {
		m[key(x)] = true
	}
	return len(m)
}

// TestHistoryRejectsNullValidFrom: a version without a start is rejected
// (a NULL never matches itself, so it would be inserted again by every
// run), even when the target's valid_from column is nullable; the other
// rows load and a replay writes nothing.
func TestHistoryRejectsNullValidFrom(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE prices (sku text NOT NULL, valid_from date, valid_to date, amount numeric(10,2), UNIQUE (sku, valid_from))`)
	require.NoError(t, err)
	job := backfill.Job{Name: "prices", Chunker: backfill.List("prices.csv"), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Extractor:  rowsFunc([]any{"a", "2024-01-01", "1.00"}, []any{"c", nil, "3.00"}, []any{"a", "2024-02-01", "2.00"}),
		Target:     backfill.Target{Table: "prices", Key: []string{"sku"}, Columns: []string{"sku", "valid_from", "amount"}, Mode: backfill.History},
		Validators: []backfill.Validator{backfill.ReplayChangesNothing{}, backfill.Completeness{CompareContent: true}}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for run := range 2 {
		job.NewRun = run > 0
		rep, err := r.Run(context.Background(), job)
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
		want := backfill.Counts{Read: 3, Inserted: 2, Rejected: 1}
		if run > 0 {
			want = backfill.Counts{Read: 3, Unchanged: 2, Rejected: 1}
		}
		require.Equal(t, want, rep.Counts)
		ex := exceptionsOf(t, db, rep.BatchID)
		require.Len(t, ex, 1)
		require.Equal(t, []any{int64(2), "valid_from", "null value in NOT NULL column"}, []any{ex[0].Row, ex[0].Column, ex[0].Reason})
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM prices`))
	require.Equal(t, 2, n)
}
