package backfilltest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// testManifestSubchunks runs the subtests of [TestManifest] for
// [backfilldriver.ManifestSubchunks] (skipped for a manifest without it):
// sub-chunks recorded in their fenced transactions, in order, the chunk
// pending and its lease its holder's between them, then done by the last.
func testManifestSubchunks(t *testing.T,
	setup func(t *testing.T) (backfill.Manifest, backfill.DB),
	plan func(t *testing.T, job, version string, hi int64) backfill.Plan,
) {
	t.Helper()
	ctx := context.Background()
	t.Run("Subchunks/RecordedInOrderUnderOneLease", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		ms, ok := m.(backfilldriver.ManifestSubchunks)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestSubchunks")
		}
		ml := m.(backfilldriver.ManifestLeases)
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		batch := run.BatchID
		require.NoError(t, ml.RegisterWorker(ctx, db, backfilltype.Worker{Key: "a", ID: "worker a", BatchID: batch, Job: "job",
			Host: "host", PID: 7, StaleAfter: time.Minute}))
		l := backfilldriver.Lease{Key: "a", StaleAfter: time.Minute}
		cl, ok, _, err := ml.LeaseChunk(ctx, db, batch, l)
		require.NoError(t, err)
		require.True(t, ok)
		c := cl.State.Chunk
		subs, err := ms.Subchunks(ctx, db, batch, c.Seq)
		require.NoError(t, err)
		require.Empty(t, subs)

		// sub fences c in a new transaction under the lease and records s.
		sub := func(s backfilltype.Subchunk, commit bool) error {
			t.Helper()
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			_, _, ok, err := ml.FenceLease(ctx, tx, batch, c.Seq, cl.Epoch, l)
			require.NoError(t, err)
			require.True(t, ok, "the lease is still the holder's")
			s.Seq = c.Seq
			if err := ms.CompleteSubchunk(ctx, tx, batch, c.ID, "a", s, []backfill.Exception{{Row: 1, Column: "x", Value: "v", Reason: "bad"}}); err != nil {
				_ = tx.Rollback()
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		}
		require.NoError(t, sub(backfilltype.Subchunk{Pos: 0, Lo: "0", Hi: "4", Counts: backfill.Counts{Read: 3, Inserted: 2, Rejected: 1}}, true))
		require.NoError(t, sub(backfilltype.Subchunk{Pos: 1, Lo: "4", Hi: "7", Counts: backfill.Counts{Read: 1, Unchanged: 1}}, false), "rolled back: not recorded")
		require.ErrorIs(t, sub(backfilltype.Subchunk{Pos: 1, Lo: "4", Hi: "7", Counts: backfill.Counts{Read: 2, Unchanged: 1}}, true), backfill.ErrAccounting)
		require.Error(t, sub(backfilltype.Subchunk{Pos: 0, Lo: "0", Hi: "7", Counts: backfill.Counts{Read: 1, Unchanged: 1}}, true), "a position recorded already")
		require.NoError(t, sub(backfilltype.Subchunk{Pos: 1, Lo: "4", Hi: "7", Counts: backfill.Counts{Read: 1, Unchanged: 1}, Split: true, Worker: "w"}, true))

		subs, err = ms.Subchunks(ctx, db, batch, c.Seq)
		require.NoError(t, err)
		require.Len(t, subs, 2)
		require.Equal(t, [2]string{"0", "4"}, [2]string{subs[0].Lo, subs[0].Hi})
		require.Equal(t, backfill.Counts{Read: 3, Inserted: 2, Rejected: 1}, subs[0].Counts)
		require.Equal(t, [2]string{"4", "7"}, [2]string{subs[1].Lo, subs[1].Hi})
		require.True(t, subs[1].Split)
		require.Equal(t, "w", subs[1].Worker)
		chunks, err := m.Chunks(ctx, db, batch)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[c.Seq].Status, "pending until its last sub-chunk")
		exc, err := m.Exceptions(ctx, db, batch)
		require.NoError(t, err)
		require.Len(t, exc, 2, "each committed sub-chunk's exceptions, under the plan chunk's ID")
		for _, e := range exc {
			require.Equal(t, c.ID, e.ChunkID)
		}

		// The last: the plan chunk completes with the sums.
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		st, _, ok, err := ml.FenceLease(ctx, tx, batch, c.Seq, cl.Epoch, l)
		require.NoError(t, err)
		require.True(t, ok)
		now := time.Now()
		require.NoError(t, m.CompleteChunk(ctx, tx, batch, backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: 4, Inserted: 2, Unchanged: 1, Rejected: 1},
			Attempt: 1, StartedAt: now, FinishedAt: now}, nil))
		require.NoError(t, tx.Commit())
		chunks, err = m.Chunks(ctx, db, batch)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkDone, chunks[c.Seq].Status)
		require.Equal(t, int64(4), chunks[c.Seq].Read)
	})
}
