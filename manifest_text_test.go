package backfill_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// Free text the library does not control reaches the manifest: a Reject's
// column and reason, an extractor's error (a source driver's message).
// Invalid UTF-8 and NUL must neither fail the chunk that queues them nor
// leave a failed run "running" with its chunk pending and no error
// recorded; they are stored as pgstore.ManifestText gives them.
func TestManifestFreeTextFromARun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE mt (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	const bad = "\xff\x00"
	want := pgstore.ManifestText(bad)
	job := backfill.Job{Name: "mt", Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone, MaxRunRejectRate: -1,
		Target: backfill.Target{Table: "mt", Key: []string{"id"}, Columns: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			if ch.Lo == 1 {
				return errors.New("source said " + bad)
			}
			if err := w.Reject(ctx, map[string]any{"k" + bad: bad}, "c"+bad, "reason"+bad); err != nil {
				return err
			}
			return w.Write(ctx, int64(0))
		})}
	r, err := backfill.New(db, &backfill.Config{RetryBackoff: 1, MaxAttempts: 1, Concurrency: 1, WorkerID: "w" + bad})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "invalid byte sequence", "a failure could not be recorded")
	require.Contains(t, err.Error(), "source said")

	run, err := backfill.NewPGManifest("").LatestRun(ctx, db, "mt")
	require.NoError(t, err)
	require.Equal(t, backfill.RunFailed, run.Status)
	require.Contains(t, run.LastError, "source said "+want)
	chunks, err := backfill.NewPGManifest("").Chunks(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkDone, chunks[0].Status)
	require.Equal(t, "w"+want, chunks[0].Worker)
	require.Equal(t, backfill.ChunkFailed, chunks[1].Status)
	require.Contains(t, chunks[1].LastError, "source said "+want)
	ex, err := backfill.NewPGManifest("").Exceptions(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Len(t, ex, 1)
	require.Equal(t, "c"+want, ex[0].Column)
	require.Equal(t, "reason"+want, ex[0].Reason)
}
