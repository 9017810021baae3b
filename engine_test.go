package backfill_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// engineJob is a job of 4 chunks of 10 ids into a fresh table; fail
// makes a chunk's attempt fail with a plain error.
func engineJob(t *testing.T, db *sqlx.DB, table string, fail func(seq int) error) backfill.Job {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, name text)`, table))
	require.NoError(t, err)
	return backfill.Job{
		Name:    table,
		Chunker: backfill.IntRange(0, 40, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if fail != nil {
				if err := fail(c.Seq); err != nil {
					return err
				}
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprintf("n%d", id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Target:   backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "name"}},
	}
}

// TestStartRunTxAndRunChunk plans a run in a caller's transaction (gone
// with its rollback, there with its commit), runs each chunk alone with a
// BeforeCommit that writes in the chunk's transaction, runs a done chunk
// again (nothing loaded, no BeforeCommit), and ends with the run
// completed and its target equal to a plain Run's.
func TestStartRunTxAndRunChunk(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE marks (seq int PRIMARY KEY)`)
	require.NoError(t, err)
	job := engineJob(t, db, "alone", nil)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	pr, err := r.StartRunTx(ctx, tx, job)
	require.NoError(t, err)
	require.Len(t, pr.Chunks, 4)
	require.NoError(t, tx.Rollback())
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs WHERE job_name = $1`, job.Name))
	require.Zero(t, runs, "a rolled back StartRunTx leaves no run")

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	pr, err = r.StartRunTx(ctx, tx, job)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, backfill.RunRunning, pr.Status)

	mark := func(seq int) func(ctx context.Context, tx *sql.Tx, res backfill.ChunkResult) error {
		return func(ctx context.Context, tx *sql.Tx, res backfill.ChunkResult) error {
			if res.Read != 10 {
				return fmt.Errorf("result read %d rows, want 10", res.Read)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO marks (seq) VALUES ($1)`, seq)
			return err
		}
	}
	for _, c := range pr.Chunks {
		rep, err := r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: c.Chunk.Seq, BeforeCommit: mark(c.Chunk.Seq)})
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkLoaded, rep.Outcome)
		require.EqualValues(t, 10, rep.Result.Inserted)
	}
	rep, err := r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: pr.Chunks[0].Chunk.Seq, BeforeCommit: mark(99)})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkAlreadyDone, rep.Outcome)
	require.Equal(t, backfill.RunCompleted, rep.RunStatus)

	var marks, rows int
	require.NoError(t, db.Get(&marks, `SELECT count(*) FROM marks`))
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM alone`))
	require.Equal(t, 4, marks)
	require.Equal(t, 40, rows)
	st, err := r.StatusOf(ctx, pr.BatchID)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, st.Status)
}

// TestRunChunkFailureAndBeforeCommitError: a BeforeCommit that fails
// rolls the chunk back (nothing merged, the attempt recorded); a
// non-retryable extractor error is final and fails the run; a paused run
// loads nothing.
func TestRunChunkFailureAndBeforeCommitError(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	boom := errors.New("source says no")
	job := engineJob(t, db, "fails", func(seq int) error {
		if seq == 2 {
			return boom
		}
		return nil
	})
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	pr, err := r.StartRunTx(ctx, tx, job)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	seq := func(i int) int { return pr.Chunks[i].Chunk.Seq }

	rep, err := r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(0), BeforeCommit: func(context.Context, *sql.Tx, backfill.ChunkResult) error {
		return &pq.Error{Code: "23505", Message: "duplicate key value violates unique constraint"}
	}})
	require.Error(t, err)
	require.Equal(t, backfill.ChunkAttemptFailed, rep.Outcome)
	require.False(t, rep.Final)
	// The engine's own error is not the chunk's: retried, not final.
	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(0), BeforeCommit: func(context.Context, *sql.Tx, backfill.ChunkResult) error {
		return errors.New("queue unavailable")
	}})
	require.ErrorContains(t, err, "queue unavailable")
	require.Equal(t, backfill.ChunkAttemptFailed, rep.Outcome)
	require.False(t, rep.Final)
	var rows int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM fails`))
	require.Zero(t, rows, "a BeforeCommit that fails rolls the chunk back")

	require.NoError(t, r.Pause(ctx, pr.BatchID, "test", "pause"))
	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(0)})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkRunPaused, rep.Outcome)
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM fails`))
	require.Zero(t, rows)
	_, err = db.Exec(`SELECT backfill.resume($1::bigint, 'test', 'resume')`, pr.BatchID)
	require.NoError(t, err)

	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(1)})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkLoaded, rep.Outcome)

	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(2)})
	require.ErrorIs(t, err, boom)
	require.Equal(t, backfill.ChunkAttemptFailed, rep.Outcome)
	require.True(t, rep.Final)
	require.Equal(t, backfill.RunFailed, rep.RunStatus)

	rep, err = r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: seq(3)})
	require.NoError(t, err)
	require.Equal(t, backfill.ChunkRunEnded, rep.Outcome)
}

// TestRunChunkMergesEveryChunk: a job with a ChunkColumn skips unchanged
// chunks by default under Run; through StartRunTx and RunChunk every
// chunk is merged, so that a replay (NewRun) still calls BeforeCommit in
// each chunk's transaction, where an engine completes its job.
func TestRunChunkMergesEveryChunk(t *testing.T) {
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE marks (batch bigint, seq int, PRIMARY KEY (batch, seq))`)
	require.NoError(t, err)
	job := engineJob(t, db, "eligible", nil)
	job.ChunkColumn = "id"
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	for round := range 2 {
		job.NewRun = round > 0
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		pr, err := r.StartRunTx(ctx, tx, job)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		for _, c := range pr.Chunks {
			rep, err := r.RunChunk(ctx, job, backfill.ChunkCall{BatchID: pr.BatchID, Seq: c.Chunk.Seq,
				BeforeCommit: func(ctx context.Context, tx *sql.Tx, res backfill.ChunkResult) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO marks VALUES ($1, $2)`, pr.BatchID, res.Chunk.Seq)
					return err
				}})
			require.NoError(t, err)
			require.Equal(t, backfill.ChunkLoaded, rep.Outcome, "round %d chunk %d", round, c.Chunk.Seq)
			require.False(t, rep.Result.Skipped)
		}
		var marks int
		require.NoError(t, db.Get(&marks, `SELECT count(*) FROM marks WHERE batch = $1`, pr.BatchID))
		require.Equal(t, 4, marks, "round %d: BeforeCommit in every chunk's transaction", round)
	}
	// The same job under Run skips by default (once a run recorded what a
	// skip compares): it is eligible, and only the engine's calls merge
	// every chunk.
	job.NewRun = true
	_, err = r.Run(ctx, job)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 4, rep.ChunksSkipped)
}
