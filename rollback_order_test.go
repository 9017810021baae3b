package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// commitOrder makes the chunks of a run commit in reverse plan order: the
// extractor of chunk seq waits until chunk seq+1 has committed (the Hooks'
// ChunkDone), so that at Concurrency 3 the last chunk commits first.
type commitOrder struct {
	mu   sync.Mutex
	done map[int]chan struct{}
}

func (o *commitOrder) ch(seq int) chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done == nil {
		o.done = map[int]chan struct{}{}
	}
	if o.done[seq] == nil {
		o.done[seq] = make(chan struct{})
	}
	return o.done[seq]
}

// reset forgets the chunks of the previous run.
func (o *commitOrder) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.done = nil
}

func (o *commitOrder) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	close(o.ch(r.Chunk.Seq))
}

// lateVersionsJob writes, in chunk seq of IntRange(0, chunks, 1), the
// versions of key "k" that versions[seq] lists (valid_from -> value); the
// extractor of a chunk below the last waits for the next one to commit.
func lateVersionsJob(o *commitOrder, chunks int, versions map[int][]time.Time, value string) backfill.Job {
	return backfill.Job{Name: "late", NewRun: true, Chunker: backfill.IntRange(0, int64(chunks), 1),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Seq < chunks-1 {
				select {
				case <-o.ch(c.Seq + 1):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			for _, vf := range versions[c.Seq] {
				if err := w.Write(ctx, "k", vf, fmt.Sprintf("%s@%s", value, vf.Format("01-02"))); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "late", Key: []string{"k"}, Mode: backfill.History, Columns: []string{"k", "valid_from", "v"}}}
}

func lateState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rows []string
	require.NoError(t, db.Select(&rows, `SELECT row(l.*)::text FROM late l ORDER BY valid_from`))
	return rows
}

// TestRollbackOfHistoryBatchesInReverseOrder: three History batches whose
// chunks each wrote a late version of the same key, committed in reverse
// plan order (so a later chunk of a batch changed the row an earlier chunk
// of the same batch changes again), are rolled back last batch first: each
// rollback succeeds, and the table is back to its state after batch 1,
// lineage included; rolling back batch 2 first is still refused.
func TestRollbackOfHistoryBatchesInReverseOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE late (k text, valid_from timestamptz, valid_to timestamptz, v text,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (k, valid_from))`)
	require.NoError(t, err)
	o := &commitOrder{}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 3, Hooks: o})
	require.NoError(t, err)

	_, err = r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(1)}, 2: {d(28)}}, "b1"))
	require.NoError(t, err)
	after1 := lateState(t, db)
	// Batches 2 and 3: each chunk a late version between Jan 1 and Jan 28,
	// splitting the version of Jan 1 again and again.
	o.reset()
	rep2, err := r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(4)}, 1: {d(10)}, 2: {d(16)}}, "b2"))
	require.NoError(t, err)
	after2 := lateState(t, db)
	o.reset()
	rep3, err := r.Run(ctx, lateVersionsJob(o, 3, map[int][]time.Time{0: {d(2)}, 1: {d(7), d(12)}, 2: {d(13), d(20)}}, "b3"))
	require.NoError(t, err)

	// Batch 2 under batch 3 is still refused, naming batch 3, and changes
	// nothing.
	after3 := lateState(t, db)
	_, err = r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "t"})
	require.ErrorIs(t, err, backfill.ErrRollbackConflict)
	require.Contains(t, err.Error(), fmt.Sprintf("(changed by batch %d)", rep3.BatchID))
	require.Contains(t, err.Error(), fmt.Sprintf("later batches still applied (batch %d)", rep3.BatchID))
	require.Contains(t, err.Error(), fmt.Sprintf("roll back batch %d first, then this batch, or use Force", rep3.BatchID))
	require.Equal(t, after3, lateState(t, db))
	// Its preview counts what it would do without those rows, and names
	// the batch to roll back first.
	pv, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Preview: true})
	require.NoError(t, err)
	require.Positive(t, pv.Conflicts)
	require.Equal(t, []int64{rep3.BatchID}, pv.ConflictBatches)

	rb3, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep3.BatchID, Actor: "t", Why: "t"})
	require.NoError(t, err, "rollback of batch 3")
	require.Equal(t, backfill.RunRolledBack, rb3.Status)
	if d := cmp.Diff(after2, lateState(t, db)); d != "" {
		t.Fatalf("after rolling back batch 3 (-want +got):\n%s", d)
	}
	rb2, err := r.Rollback(ctx, lateVersionsJob(o, 3, nil, ""), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "t", Why: "t"})
	require.NoError(t, err, "rollback of batch 2")
	require.Equal(t, backfill.RunRolledBack, rb2.Status)
	if d := cmp.Diff(after1, lateState(t, db)); d != "" {
		t.Fatalf("after rolling back batch 2 (-want +got):\n%s", d)
	}
}
