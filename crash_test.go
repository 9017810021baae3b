package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// crashJob is the job run by the child process of TestKillDashNine: 40
// chunks of 250 rows with a little sleep per chunk, so that a kill lands in
// the middle of chunks.
func crashJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	job.Name = "crash"
	job.Chunker = backfill.IntRange(0, 10000, 250)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		time.Sleep(15 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	return job
}

func init() {
	// The child process of TestKillDashNine: run the crash job; its last
	// chunks never finish by themselves, the parent kills it.
	childProcess("BACKFILL_CRASH_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
		if err != nil {
			return err
		}
		job := crashJob(&itemsSetup{db: db})
		inner := job.Extractor
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Lo >= 9000 {
				time.Sleep(time.Minute)
			}
			return inner.Extract(ctx, c, w)
		})
		_, err = r.Run(context.Background(), job)
		return err
	})
}

func createItems(t *testing.T, db *sqlx.DB) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12),
		amount numeric(10,2), seen_at timestamptz, backfill_inserted_by bigint, backfill_updated_by bigint,
		PRIMARY KEY (tenant, id))`)
	require.NoError(t, err)
}

type itemRow struct {
	Tenant string  `db:"tenant"`
	ID     int64   `db:"id"`
	Name   *string `db:"name"`
	Amount *string `db:"amount"`
}

func itemRows(t *testing.T, db *sqlx.DB) []itemRow {
	t.Helper()
	var rows []itemRow
	require.NoError(t, db.Select(&rows, `SELECT tenant, id, name, amount::text AS amount FROM items ORDER BY tenant, id`))
	return rows
}

// TestKillDashNine kills a running backfill with SIGKILL at several points,
// resumes it, and checks that the target equals an uninterrupted run's and
// that no chunk was counted twice.
func TestKillDashNine(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()

	// Reference: an uninterrupted run.
	ref := pgtest.New(t)
	createItems(t, ref)
	r, err := backfill.New(ref, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, crashJob(&itemsSetup{db: ref}))
	require.NoError(t, err)
	want := itemRows(t, ref)
	require.Len(t, want, 10000)

	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	createItems(t, db)
	kills := 0
	for _, doneBeforeKill := range []int{3, 11, 24} {
		killChildWhen(t, db, "BACKFILL_CRASH_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`, doneBeforeKill)
		kills++
	}
	require.Equal(t, 3, kills)

	var done int
	require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
	require.Less(t, done, 40, "the child was killed before the end")

	r, err = backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, crashJob(&itemsSetup{db: db}))
	require.NoError(t, err)
	require.True(t, rep.Resumed)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 40-done, rep.ChunksRun, "resume ran only the chunks not done")
	require.Equal(t, backfill.Counts{Read: 10000, Inserted: 10000}, rep.Counts, "no chunk counted twice")
	if d := cmp.Diff(want, itemRows(t, db)); d != "" {
		t.Fatalf("target after kill -9 and resume differs from an uninterrupted run (-want +got):\n%s", d)
	}
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Equal(t, 1, runs, "every restart resumed the same batch")
}
