package backfill

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestStatusCountersNeverDecrease is a property test of the manifest's
// progress across any sequence of checkpoints (done, or open and read
// again), failed attempts (retried or final) and resumes (failed chunks
// pending again, open chunks claimable again): after every step, the
// checkpointed chunks, RowsProcessed and ChunkReads never decrease, the
// rows by outcome balance, and they never decrease either while no
// re-read of an open chunk found fewer rows than its earlier read (the
// one documented exception, Counts.Reread; the counts this step
// checkpointed only replace counts when it commits, so a rolled back
// step that would have shrunk them only makes the check stricter).
// Chunks by status always sum
// to the plan's total. On the starting commit there was no Status and no
// rows_processed.
func TestStatusCountersNeverDecrease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	require.NoError(t, pm.Init(ctx, db))
	var jobs atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(rt, "chunks")
		ch := IntRange(0, int64(10*n), 10)
		chunks, err := ch.Chunks(ctx)
		require.NoError(rt, err)
		job := Job{Name: fmt.Sprintf("mono%d", jobs.Add(1)), Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
		plan := NewPlan(job, TableInfo{Target: job.Target}, chunks)
		run, _, err := pm.StartRun(ctx, db, plan, "w", false)
		require.NoError(rt, err)
		b := run.BatchID
		var prev Status
		shrunk := false
		steps := rapid.IntRange(1, 25).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			switch op := rapid.SampledFrom([]string{"complete", "complete", "fail", "resume"}).Draw(rt, "op"); op {
			case "complete":
				tx, err := db.Beginx()
				require.NoError(rt, err)
				st, ok, err := pm.ClaimChunk(ctx, tx, b)
				require.NoError(rt, err)
				if !ok {
					require.NoError(rt, tx.Rollback())
					continue
				}
				c := Counts{Inserted: rapid.Int64Range(0, 20).Draw(rt, "ins"), Updated: rapid.Int64Range(0, 20).Draw(rt, "upd"),
					Unchanged: rapid.Int64Range(0, 20).Draw(rt, "unch"), Rejected: rapid.Int64Range(0, 5).Draw(rt, "rej"),
					Deduplicated: rapid.Int64Range(0, 5).Draw(rt, "dedup")}
				c.Read = c.Inserted + c.Updated + c.Unchanged + c.Rejected + c.Deduplicated
				if st.Status == ChunkOpen {
					next := st.Counts.Reread(c)
					if next.Read < st.Read || next.Inserted < st.Inserted || next.Updated < st.Updated ||
						next.Unchanged < st.Unchanged || next.Rejected < st.Rejected || next.Deduplicated < st.Deduplicated {
						shrunk = true
					}
				}
				open := rapid.Bool().Draw(rt, "open")
				require.NoError(rt, pm.CompleteChunk(ctx, tx, b, ChunkResult{Chunk: st.Chunk, Counts: c, Worker: "w", Open: open}, nil))
				if rapid.Bool().Draw(rt, "commit") {
					require.NoError(rt, tx.Commit())
				} else {
					require.NoError(rt, tx.Rollback()) // a crash before the commit
				}
			case "fail":
				seq := rapid.IntRange(0, n-1).Draw(rt, "seq")
				require.NoError(rt, pm.FailChunk(ctx, db, b, seq, "boom", rapid.Bool().Draw(rt, "final")))
			case "resume":
				_, _, err := pm.StartRun(ctx, db, plan, "w", false)
				require.NoError(rt, err)
			}
			s, err := pm.Status(ctx, db, b)
			require.NoError(rt, err)
			c := s.Chunks
			require.Equal(rt, n, c.Total)
			require.Equal(rt, c.Total, c.Done+c.Open+c.Pending+c.Failed+c.Staged+c.RolledBack+c.Other)
			require.True(rt, s.Rows.Balanced(), "rows balance: %+v", s.Rows)
			require.GreaterOrEqual(rt, c.Done, prev.Chunks.Done, "chunks done")
			require.GreaterOrEqual(rt, c.Done+c.Open, prev.Chunks.Done+prev.Chunks.Open, "chunks checkpointed")
			require.GreaterOrEqual(rt, s.RowsProcessed, prev.RowsProcessed, "rows processed")
			require.GreaterOrEqual(rt, s.ChunkReads, prev.ChunkReads, "chunk reads")
			require.GreaterOrEqual(rt, s.RowsProcessed, s.Rows.Read)
			if !shrunk {
				for _, f := range []struct {
					name      string
					now, then int64
				}{{"read", s.Rows.Read, prev.Rows.Read}, {"inserted", s.Rows.Inserted, prev.Rows.Inserted},
					{"updated", s.Rows.Updated, prev.Rows.Updated}, {"unchanged", s.Rows.Unchanged, prev.Rows.Unchanged},
					{"rejected", s.Rows.Rejected, prev.Rows.Rejected}, {"deduplicated", s.Rows.Deduplicated, prev.Rows.Deduplicated}} {
					require.GreaterOrEqual(rt, f.now, f.then, "rows %s", f.name)
				}
			}
			require.Equal(rt, c.Pending+c.Failed, s.RemainingChunks)
			prev = s
		}
	})
}
