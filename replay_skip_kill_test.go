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

// slowSkipJob is skipJob over a source in which item 450 changed since
// the load (its chunk merges, the nine others skip), extracting slowly
// enough that a kill -9 lands in the middle of the replay.
func slowSkipJob() backfill.Job {
	src := newSkipSource()
	src.set(450, "changed", "4.50")
	job := skipJob(src)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		time.Sleep(100 * time.Millisecond)
		return inner.Extract(ctx, c, w)
	})
	return job
}

// skipKillConfig fences the killed child's leases within a second.
func skipKillConfig() *backfill.Config {
	return &backfill.Config{Concurrency: 2, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second}
}

func init() {
	childProcess("BACKFILL_SKIP_KILL_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, skipKillConfig())
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), slowSkipJob())
		return err
	})
}

// TestSkipUnchangedSkippedChunksAreRecorded: which chunks a replay
// skipped is recorded with each chunk's checkpoint, in its transaction,
// not only in the memory of the call that skipped them: after a kill -9
// in the middle of a skipping replay and a resume, the report, the
// status and the chunks count every chunk the batch skipped, whichever
// call skipped it.
func TestSkipUnchangedSkippedChunksAreRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	createItems(t, db)
	r, err := backfill.New(db, skipKillConfig())
	require.NoError(t, err)
	rep1, err := r.Run(ctx, skipJob(newSkipSource()))
	require.NoError(t, err)
	require.Zero(t, rep1.ChunksSkipped)
	killChildWhen(t, db, "BACKFILL_SKIP_KILL_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE batch_id > 1 AND status = 'done'`, 4)

	job := slowSkipJob()
	job.NewRun = false
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.True(t, rep2.Resumed)
	require.NotEqual(t, rep1.BatchID, rep2.BatchID)
	require.Less(t, rep2.ChunksRun, 10, "the killed call checkpointed some chunks")
	require.Equal(t, 9, rep2.ChunksSkipped, "every chunk of the batch but the changed one, whichever call skipped it")
	requireBalanced(t, db, rep2.BatchID)
	var skipped []string
	for _, c := range manifestChunks(t, db, rep2.BatchID) {
		require.Equal(t, backfill.ChunkDone, c.Status)
		if c.Skipped {
			skipped = append(skipped, c.Chunk.ID)
			require.Zero(t, c.Inserted+c.Updated, c.Chunk.ID)
		} else {
			require.Equal(t, "int:400/500", c.Chunk.ID)
			require.Equal(t, int64(1), c.Updated)
		}
	}
	require.Len(t, skipped, 9)
	st, err := r.StatusOf(ctx, rep2.BatchID)
	require.NoError(t, err)
	require.Equal(t, 9, st.Chunks.Skipped)
	require.Contains(t, st.String(), "9 skipped unchanged")
	rr, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep2.BatchID)
	require.NoError(t, err)
	require.Equal(t, 9, rr.Totals.ChunksSkipped)
	n := 0
	for _, c := range rr.Chunks {
		if c.Skipped {
			n++
		}
	}
	require.Equal(t, 9, n)
}
