package backfilltest_test

import (
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
		m.AddTable("items", []string{"tenant", "id"}, "tenant", "id", "name")
		return backfilltest.MergerHarness{Merger: m, DB: backfilltest.NewDB(), Table: "items",
			Rows: func(t *testing.T) [][]any { return m.Rows("items") }}
	})
}
