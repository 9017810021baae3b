package backfill_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// slowVersions is a versionedSource whose ChunkVersion takes 100 ms, so
// that a kill -9 lands in the middle of a replay that skips on versions.
type slowVersions struct{ *versionedSource }

func (s slowVersions) ChunkVersion(ctx context.Context, c backfill.Chunk) (string, error) {
	time.Sleep(100 * time.Millisecond)
	return s.versionedSource.ChunkVersion(ctx, c)
}

// versionKillJob is a replay over a source in which item 450 changed
// since the load: chunk int:400/500 is extracted and merged, the nine
// others skip on their versions.
func versionKillJob() (backfill.Job, *versionedSource) {
	src := newVersionedSource()
	src.set(450, "changed", "4.50")
	job := skipJob(src.skipSource)
	job.Extractor = slowVersions{src}
	return job, src
}

func init() {
	childProcess("BACKFILL_VERSION_KILL_CHILD", func(db *sqlx.DB) error {
		cfg := skipKillConfig()
		cfg.ExtractAhead = true
		r, err := backfill.New(db, cfg)
		if err != nil {
			return err
		}
		job, _ := versionKillJob()
		_, err = r.Run(context.Background(), job)
		return err
	})
}

// TestChunkVersionKilledMidReplay: the version is written only by the
// chunk's checkpoint statement. A kill -9 in the middle of a replay that
// skips on versions (ExtractAhead on), then a resume: every chunk is done
// once and balanced, nine skipped; every chunk of the batch recorded its
// version, and a further replay extracts nothing and skips all ten.
func TestChunkVersionKilledMidReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	createItems(t, db)
	r, err := backfill.New(db, skipKillConfig())
	require.NoError(t, err)
	first := newVersionedSource()
	load := skipJob(first.skipSource)
	load.Extractor = first
	rep1, err := r.Run(ctx, load)
	require.NoError(t, err)
	killChildWhen(t, db, "BACKFILL_VERSION_KILL_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE batch_id > 1 AND status = 'done'`, 4)

	job, src := versionKillJob()
	job.NewRun = false
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.True(t, rep2.Resumed)
	require.NotEqual(t, rep1.BatchID, rep2.BatchID)
	require.Less(t, rep2.ChunksRun, 10, "the killed call checkpointed some chunks")
	require.Equal(t, 9, rep2.ChunksSkipped)
	requireBalanced(t, db, rep2.BatchID)
	var missing int
	require.NoError(t, db.Get(&missing, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND (status <> 'done' OR coalesce(source_version, '') = '')`, rep2.BatchID))
	require.Zero(t, missing, "chunks of the resumed batch not done, or done without their version")
	var name string
	require.NoError(t, db.Get(&name, `SELECT name FROM items WHERE id = 450`))
	require.Equal(t, "changed", name)

	src.calls()
	job.NewRun = true
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	extracted, _ := src.calls()
	require.Empty(t, extracted, "a replay after the resumed one extracted chunks")
	require.Equal(t, 10, rep3.ChunksSkipped)
}
