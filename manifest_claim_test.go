package backfill

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestClaimWalksClaimableIndex: the claim (ClaimChunk, claimLeased) and
// the lease (leaseChunk) of a long plan walk the index of claimable
// chunks in seq order and stop at the first row, with no sort of the
// batch's chunks: a new plan (every chunk pending) and one whose chunks
// are nearly all done. A bitmap scan and a sort of every pending chunk
// made a claim cost time in proportion to the plan.
func TestClaimWalksClaimableIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		t.Fatal(err)
	}
	const n = 5000
	ch := IntRange(0, n, 1)
	chunks, err := ch.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want int) {
		t.Helper()
		for name, q := range map[string]struct {
			sql  string
			args []any
		}{
			"claim": {claimQuery, []any{run.BatchID, "{}"}},
			"lease": {leaseQuery, []any{run.BatchID, "{}", "k", 30.0}},
		} {
			err := inTx(ctx, db, func(tx sqlx.ExtContext) error {
				var plan []string
				if err := sqlx.SelectContext(ctx, tx, &plan, `EXPLAIN (COSTS OFF) `+pm.sql(q.sql), q.args...); err != nil {
					return err
				}
				p := strings.Join(plan, "\n")
				if !strings.Contains(p, "Index Scan using chunks_claimable on chunks") || strings.Contains(p, "Sort") || strings.Contains(p, "Bitmap") {
					t.Errorf("%s, %s: want an index scan of chunks_claimable without a sort, plan:\n%s", when, name, p)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		st, ok, err := pm.ClaimChunk(ctx, tx, run.BatchID)
		if err != nil || !ok || st.Chunk.Seq != want {
			t.Fatalf("%s: claim: %v, %v, chunk %d, want %d", when, ok, err, st.Chunk.Seq, want)
		}
	}
	check("new plan", 0)
	if _, err := db.Exec(`UPDATE backfill.chunks SET status = 'done' WHERE batch_id = $1 AND seq < $2`, run.BatchID, n-10); err != nil {
		t.Fatal(err)
	}
	check("nearly done", n-10)
}
