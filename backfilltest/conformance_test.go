package backfilltest_test

import (
	"slices"
	"testing"

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
