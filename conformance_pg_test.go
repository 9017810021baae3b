package backfill_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestPGManifestConformance(t *testing.T) {
	t.Parallel()
	backfilltest.TestManifest(t, func(t *testing.T) (backfill.Manifest, backfill.DB) {
		return backfill.NewPGManifest("ledger"), backfill.Postgres(pgtest.New(t))
	})
}

func TestPGMergerConformance(t *testing.T) {
	t.Parallel()
	backfilltest.TestMerger(t, func(t *testing.T) backfilltest.MergerHarness {
		db := pgtest.New(t)
		_, err := db.Exec(`CREATE TABLE "Items" (tenant text, id bigint, name text, PRIMARY KEY (tenant, id))`)
		require.NoError(t, err)
		return backfilltest.MergerHarness{Merger: backfill.NewPGMerger(), DB: backfill.Postgres(db), Table: "Items",
			Rows: func(t *testing.T) [][]any {
				rows, err := db.Queryx(`SELECT tenant, id, name FROM "Items" ORDER BY tenant, id`)
				require.NoError(t, err)
				defer rows.Close()
				var out [][]any
				for rows.Next() {
					var tenant string
					var id int64
					var name *string
					require.NoError(t, rows.Scan(&tenant, &id, &name))
					var n any
					if name != nil {
						n = *name
					}
					out = append(out, []any{tenant, id, n})
				}
				require.NoError(t, rows.Err())
				return out
			}}
	})
}

func TestFakesRunAJob(t *testing.T) {
	t.Parallel()
	m := backfilltest.NewMerger()
	m.AddTable("items", []string{"tenant", "id"}, "tenant", "id", "name", "amount", "seen_at")
	man := backfilltest.NewManifest()
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m, Concurrency: 2})
	require.NoError(t, err)
	s := &itemsSetup{}
	rep, err := r.Run(t.Context(), s.job(1))
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	require.Len(t, m.Rows("items"), 1000)
	job := s.job(1)
	job.NewRun = true
	rep, err = r.Run(t.Context(), job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
}
