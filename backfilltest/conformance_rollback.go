package backfilltest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// testUndoRollback runs the subtests of [TestMerger] for the undo log
// and its rollback ([backfilldriver.MergerRollback], [backfilldriver.ManifestRollback])
// through a [backfill.Runner], skipped when the harness has no Manifest or
// either lacks the capability. Each implementation must leave the same
// table.
func testUndoRollback(t *testing.T, newHarness func(t *testing.T) MergerHarness) {
	t.Helper()
	ctx := context.Background()
	// setup returns a runner on the harness with table "accounts" (id,
	// name and lineage), and a job named name that writes ids lo..hi-1
	// with names prefix-id, in chunks of two ids.
	setup := func(t *testing.T) (MergerHarness, *backfill.Runner, func(name string, lo, hi int64, prefix string) backfill.Job) {
		t.Helper()
		h := newHarness(t)
		_, ok1 := h.Merger.(backfilldriver.MergerRollback)
		_, ok2 := h.Manifest.(backfilldriver.ManifestRollback)
		if h.Manifest == nil || !ok1 || !ok2 {
			t.Skip("the harness has no manifest, or it or the merger lacks the rollback capabilities")
		}
		h.CreateTable(t, "accounts", []ColumnDef{{"id", "bigint"}, {"name", "text"}, {"inserted_by", "bigint"}, {"updated_by", "bigint"}}, []string{"id"})
		r, err := backfill.NewWithDB(h.DB, &backfill.Config{Manifest: h.Manifest, Merger: h.Merger})
		require.NoError(t, err)
		job := func(name string, lo, hi int64, prefix string) backfill.Job {
			return backfill.Job{
				Name:    name,
				Chunker: backfill.IntRange(lo, hi, 2),
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					for id := c.Lo; id < c.Hi; id++ {
						if err := w.Write(ctx, id, fmt.Sprintf("%s-%d", prefix, id)); err != nil {
							return err
						}
					}
					return nil
				}),
				Rollback: backfill.RollbackUndoLog,
				Target: backfill.Target{Table: "accounts", Key: []string{"id"}, Columns: []string{"id", "name"},
					Lineage: backfill.Lineage{InsertedBy: "inserted_by", UpdatedBy: "updated_by"}},
			}
		}
		return h, r, job
	}
	table := func(t *testing.T, h MergerHarness) [][]any {
		t.Helper()
		rows := h.Rows(t, "accounts")
		slices.SortFunc(rows, func(a, b []any) int { return cmp.Compare(a[0].(int64), b[0].(int64)) })
		return rows
	}
	row := func(id int64, prefix string, ib, ub int64) []any {
		return []any{id, fmt.Sprintf("%s-%d", prefix, id), ib, ub}
	}
	// run loads batch 1 (ids 0-3, v1) and batch 2 (ids 2-5, v2: it
	// updates 2 and 3 and inserts 4 and 5).
	run := func(t *testing.T, r *backfill.Runner, job func(string, int64, int64, string) backfill.Job) (backfill.Job, backfill.Job, int64, int64) {
		t.Helper()
		j1, j2 := job("first", 0, 4, "v1"), job("second", 2, 6, "v2")
		rep1, err := r.Run(ctx, j1)
		require.NoError(t, err)
		rep2, err := r.Run(ctx, j2)
		require.NoError(t, err)
		require.Equal(t, int64(2), rep2.Counts.Updated)
		return j1, j2, rep1.BatchID, rep2.BatchID
	}
	opts := func(batch int64, force bool) backfill.RollbackOptions {
		return backfill.RollbackOptions{BatchID: batch, Force: force, Actor: "ann", Why: "conformance"}
	}

	t.Run("UndoRollbackInReverseOrder", func(t *testing.T) {
		t.Parallel()
		h, r, job := setup(t)
		j1, j2, b1, b2 := run(t, r, job)
		want := [][]any{row(0, "v1", b1, b1), row(1, "v1", b1, b1), row(2, "v2", b1, b2), row(3, "v2", b1, b2), row(4, "v2", b2, b2), row(5, "v2", b2, b2)}
		require.Empty(t, gocmp.Diff(want, table(t, h)), "after both batches")

		// Batch 1 under batch 2: refused, nothing changes.
		prev, err := r.Rollback(ctx, j1, backfill.RollbackOptions{BatchID: b1, Preview: true})
		require.NoError(t, err)
		require.Equal(t, int64(2), prev.Conflicts, "rows 2 and 3, changed by batch 2")
		require.Equal(t, []string{`{"id": 2}`, `{"id": 3}`}, prev.ConflictKeys)
		require.Equal(t, []int64{b2}, prev.ConflictBatches, "the batch to roll back first")
		require.Equal(t, int64(2), prev.Deleted, "without Force only rows 0 and 1")
		_, err = r.Rollback(ctx, j1, opts(b1, false))
		require.ErrorIs(t, err, backfill.ErrRollbackConflict)
		require.ErrorContains(t, err, fmt.Sprintf("roll back batch %d first, then this batch, or use Force", b2))
		require.Empty(t, gocmp.Diff(want, table(t, h)), "a refused rollback changes nothing")

		// Batch 2: rows 2 and 3 get batch 1's images back, 4 and 5 go.
		prev, err = r.Rollback(ctx, j2, backfill.RollbackOptions{BatchID: b2, Preview: true})
		require.NoError(t, err)
		require.Equal(t, [3]int64{0, 2, 2}, [3]int64{prev.Conflicts, prev.Deleted, prev.Restored})
		rep, err := r.Rollback(ctx, j2, opts(b2, false))
		require.NoError(t, err)
		require.Equal(t, [4]int64{2, 2, 2, 0}, [4]int64{int64(rep.Chunks), rep.Deleted, rep.Restored, rep.Conflicts})
		require.Equal(t, backfill.RunRolledBack, rep.Status)
		batch1 := [][]any{row(0, "v1", b1, b1), row(1, "v1", b1, b1), row(2, "v1", b1, b1), row(3, "v1", b1, b1)}
		require.Empty(t, gocmp.Diff(batch1, table(t, h)), "batch 1's table again")
		again, err := r.Rollback(ctx, j2, opts(b2, false))
		require.NoError(t, err)
		require.Equal(t, [3]int64{0, 0, 0}, [3]int64{int64(again.Chunks), again.Deleted, again.Restored}, "rolled back already: nothing changes")

		// Then batch 1: its inserts go.
		rep, err = r.Rollback(ctx, j1, opts(b1, false))
		require.NoError(t, err)
		require.Equal(t, [3]int64{4, 0, 0}, [3]int64{rep.Deleted, rep.Restored, rep.Conflicts})
		require.Empty(t, table(t, h), "nothing of either batch is left")
		audit := h.Manifest.(backfilldriver.ManifestAudit)
		events, err := audit.Events(ctx, h.DB, b1)
		require.NoError(t, err)
		require.True(t, slices.ContainsFunc(events, func(e backfilltype.Event) bool { return e.Kind == "rollback" && e.Actor == "ann" }), "recorded in the audit log")
	})

	t.Run("UndoRollbackOfChunksCommittedOutOfOrder", func(t *testing.T) {
		t.Parallel()
		h, r, job := setup(t)
		_, err := r.Run(ctx, job("first", 0, 2, "v1"))
		require.NoError(t, err)
		batch1 := table(t, h)
		// Both chunks of batch 2 write row 0; chunk 1 commits first (the
		// extractor of chunk 0 waits for it), so chunk 0's prior image of
		// row 0 is chunk 1's.
		done := make(chan struct{})
		conc, err := backfill.NewWithDB(h.DB, &backfill.Config{Manifest: h.Manifest, Merger: h.Merger, Concurrency: 2,
			Hooks: backfill.HooksFunc(func(ctx context.Context, batchID int64, r backfill.ChunkResult) {
				if r.Chunk.Seq == 1 {
					close(done)
				}
			})})
		require.NoError(t, err)
		j2 := job("second", 0, 2, "v2")
		j2.Chunker = backfill.IntRange(0, 2, 1)
		j2.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Seq == 0 {
				select {
				case <-done:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return w.Write(ctx, int64(0), fmt.Sprintf("v2-seq%d", c.Seq))
		})
		rep2, err := conc.Run(ctx, j2)
		require.NoError(t, err)
		require.Equal(t, "v2-seq0", table(t, h)[0][1], "chunk 0 committed last")

		// Rolled back in reverse commit order: row 0 is batch 1's again.
		rep, err := r.Rollback(ctx, j2, opts(rep2.BatchID, false))
		require.NoError(t, err)
		require.Equal(t, [3]int64{2, 2, 0}, [3]int64{int64(rep.Chunks), rep.Restored, rep.Conflicts}, "each chunk restores its prior image of row 0")
		require.Empty(t, gocmp.Diff(batch1, table(t, h)), "batch 1's table again, lineage included")
	})

	t.Run("UndoRollbackForcedOverALaterBatch", func(t *testing.T) {
		t.Parallel()
		h, r, job := setup(t)
		j1, _, b1, b2 := run(t, r, job)
		prev, err := r.Rollback(ctx, j1, backfill.RollbackOptions{BatchID: b1, Preview: true, Force: true})
		require.NoError(t, err)
		require.Equal(t, [3]int64{2, 4, 0}, [3]int64{prev.Conflicts, prev.Deleted, prev.Restored})
		rep, err := r.Rollback(ctx, j1, opts(b1, true))
		require.NoError(t, err)
		require.Equal(t, [3]int64{4, 0, 2}, [3]int64{rep.Deleted, rep.Restored, rep.Conflicts})
		require.Empty(t, gocmp.Diff([][]any{row(4, "v2", b2, b2), row(5, "v2", b2, b2)}, table(t, h)),
			"Force deletes the rows batch 1 inserted although batch 2 changed them")
	})
}
