package backfill_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestVersionedViewReadersNeverSeeAMix: while a run loads a new version,
// a concurrent reader of the view sees the old version or the new one,
// never a mix; rollback switches the view back.
func TestVersionedViewReadersNeverSeeAMix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job := func(version int64, slow bool) backfill.Job {
		return backfill.Job{Name: "orders", NewRun: true, Chunker: backfill.IntRange(0, 200, 20), ChunkColumn: "id",
			Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "orders_current"},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				if slow {
					time.Sleep(20 * time.Millisecond)
				}
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, id*version); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "orders", Key: []string{"id"}, Columns: []string{"id", "amount"}}}
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	rep1, err := r.Run(ctx, job(1, false))
	require.NoError(t, err)
	state := func() string {
		var s string
		require.NoError(t, db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`))
		return s
	}
	v1 := state()
	require.Equal(t, fmt.Sprintf("200/%d", 199*200/2), v1)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM orders`))
	require.Zero(t, n, "the base table is untouched: versions hold the data")

	var stop atomic.Bool
	seen := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var s string
			if err := db.Get(&s, `SELECT count(*) || '/' || sum(amount) FROM orders_current`); err == nil {
				mu.Lock()
				seen[s]++
				mu.Unlock()
			}
		}
	}()
	rep2, err := r.Run(ctx, job(2, true))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	v2 := fmt.Sprintf("200/%d", 199*200)
	require.Equal(t, v2, state())
	for s := range seen {
		require.Contains(t, []string{v1, v2}, s, "a reader saw a mix of versions")
	}
	require.Greater(t, seen[v1], 0, "the reader saw the old version during the load")

	rb, err := r.Rollback(ctx, job(2, false), backfill.RollbackOptions{BatchID: rep2.BatchID, Actor: "ann", Why: "bad amounts"})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	require.Equal(t, v1, state(), "switched back to the previous version")
	_, err = r.Rollback(ctx, job(1, false), backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "first"})
	require.ErrorIs(t, err, backfill.ErrUnsupported, "the first version has nothing to switch back to")
}
