package backfilltest_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

func TestFakeManifestConformance(t *testing.T) {
	backfilltest.TestManifest(t, func(t *testing.T) (backfill.Manifest, backfill.DB) {
		return backfilltest.NewManifest(), backfilltest.NewDB()
	})
}

func TestFakeMergerConformance(t *testing.T) {
	backfilltest.TestMerger(t, func(t *testing.T) backfilltest.MergerHarness {
		m := backfilltest.NewMerger()
		return backfilltest.MergerHarness{
			Merger:   m,
			DB:       backfilltest.NewDB(),
			Manifest: backfilltest.NewManifest(),
			CreateTable: func(t *testing.T, table string, columns []backfilltest.ColumnDef, unique []string) {
				cols := make([]backfill.Column, len(columns))
				for i, c := range columns {
					cols[i] = backfill.Column{Name: c.Name, Type: c.Type}
				}
				m.AddTableColumns(table, slices.Clone(unique), cols...)
			},
			Truncate: func(t *testing.T, table string) { m.Truncate(table) },
			Rows:     func(t *testing.T, table string) [][]any { return m.Rows(table) },
			AddUnique: func(t *testing.T, table, name string, columns []string) {
				m.AddUnique(table, name, columns...)
			},
			AddCheck: func(t *testing.T, table, name, column string, min int64) {
				m.AddCheck(table, name, func(col func(string) any) bool {
					v, ok := col(column).(int64)
					return !ok || v >= min // NULL passes
				})
			},
		}
	})
}

// TestFakeMergerFollowsTheEqualityRule: on columns declared with their
// types, the fake merger decides "same row" and "same content" as the
// PostgreSQL merger does (package backfill, "Equality"): numeric keys by
// their number, numeric content by its stored form (the scale of an
// unconstrained numeric, numeric(p,s) rounded to s), char(n) without its
// padding.
func TestFakeMergerFollowsTheEqualityRule(t *testing.T) {
	ctx := context.Background()
	m := backfilltest.NewMerger()
	m.AddTableColumns("t", []string{"k"},
		backfill.Column{Name: "k", Type: "numeric", BaseType: "numeric", NotNull: true},
		backfill.Column{Name: "amount", Type: "numeric", BaseType: "numeric"},
		backfill.Column{Name: "fixed", Type: "numeric(12,2)", BaseType: "numeric", Precision: 12, Scale: 2},
		backfill.Column{Name: "code", Type: "character(4)", BaseType: "bpchar", MaxLen: 4})
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: m})
	require.NoError(t, err)
	run := func(row ...any) backfill.Counts {
		t.Helper()
		rep, err := r.Run(ctx, backfill.Job{Name: "t", Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				return w.Write(ctx, row...)
			}),
			Target: backfill.Target{Table: "t", Key: []string{"k"}}})
		require.NoError(t, err)
		return rep.Counts
	}
	require.Equal(t, backfill.Counts{Read: 1, Inserted: 1}, run("1.0", "1.5", "1.5", "ab"))
	require.Equal(t, backfill.Counts{Read: 1, Unchanged: 1}, run("1.00", "15e-1", "1.50", "ab  "), "respelled key and values")
	require.Equal(t, backfill.Counts{Read: 1, Updated: 1}, run("1", "1.50", "1.50", "ab"), "another scale of an unconstrained numeric")
	require.Len(t, m.Rows("t"), 1)

	// A float key: -0 is 0 to a unique index.
	m.AddTableColumns("f", []string{"k"}, backfill.Column{Name: "k", Type: "double precision", BaseType: "float8", NotNull: true},
		backfill.Column{Name: "v", Type: "text", BaseType: "text"})
	for i, k := range []float64{0, math.Copysign(0, -1)} {
		rep, err := r.Run(ctx, backfill.Job{Name: "f", Chunker: backfill.List("all"), NewRun: true, Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				return w.Write(ctx, k, "x")
			}),
			Target: backfill.Target{Table: "f", Key: []string{"k"}}})
		require.NoError(t, err)
		require.Equal(t, int64(i), rep.Counts.Unchanged, "key %v", k)
	}
	require.Len(t, m.Rows("f"), 1)
}
