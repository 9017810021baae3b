package backfill_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestPoolerSkipUnchanged: through PgBouncer (transaction mode), Concurrency 4, SkipUnchanged:
// a staging refusal (bad int text) and a merge refusal (CHECK) in the
// batched savepoint paths, then a replay with one changed row.
func TestPoolerSkipUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewPoolerURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`CREATE TABLE pz (id bigint PRIMARY KEY, v text NOT NULL, n int CHECK (n >= 0))`)
	job := func(change int64, newRun bool) backfill.Job {
		return backfill.Job{Name: "pz", Chunker: backfill.IntRange(0, 100, 5), Rollback: backfill.RollbackNone, SkipUnchanged: true, NewRun: newRun, MaxRunRejectRate: -1,
			Target: backfill.Target{Table: "pz", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					var n any = id
					switch id {
					case 7:
						n = -1 // CHECK refuses it in the merge
					case 13:
						n = "abc" // COPY refuses it in staging
					}
					v := fmt.Sprint("v", id)
					if id == change {
						v += "x"
					}
					if err := w.Write(ctx, id, v, n); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 4})
	require.NoError(t, err)
	rep1, err := r.Run(ctx, job(-1, false))
	require.NoError(t, err)
	rep2, err := r.Run(ctx, job(-1, true))
	require.NoError(t, err)
	rep3, err := r.Run(ctx, job(42, true))
	require.NoError(t, err)
	// Every chunk skips on replay but the one whose merge refused a row
	// (never recorded); the restatement also merges the changed chunk.
	require.Equal(t, []int{0, 19, 18}, []int{rep1.ChunksSkipped, rep2.ChunksSkipped, rep3.ChunksSkipped})
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM pz`))
	require.Equal(t, 98, n)
	var v string
	require.NoError(t, db.Get(&v, `SELECT v FROM pz WHERE id = 42`))
	require.Equal(t, "v42x", v)
	var ex []struct {
		B  int64  `db:"batch_id"`
		ID string `db:"chunk_id"`
		C  int    `db:"c"`
	}
	require.NoError(t, db.Select(&ex, `SELECT batch_id, chunk_id, count(*) c FROM backfill.exceptions GROUP BY 1,2 ORDER BY 1,2`))
	t.Logf("exceptions %+v", ex)
	require.Len(t, ex, 6, "each batch queues the two refused rows once")
	var sums []struct {
		B  int64 `db:"batch_id"`
		Rd int64 `db:"rd"`
		Rj int64 `db:"rj"`
	}
	require.NoError(t, db.Select(&sums, `SELECT batch_id, sum(rows_read) rd, sum(rows_rejected) rj FROM backfill.chunks GROUP BY 1 ORDER BY 1`))
	t.Logf("sums %+v", sums)
	var ns []string
	require.NoError(t, db.Select(&ns, `SELECT chunk_id FROM backfill.chunks WHERE batch_id = 2 AND NOT skipped`))
	require.Equal(t, []string{"int:5/10"}, ns, "chunks merged in the unchanged replay")
	for _, s := range sums {
		require.Equal(t, int64(100), s.Rd)
		require.Equal(t, int64(2), s.Rj)
	}
}
