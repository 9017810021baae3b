package backfill

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestClaimWalksClaimableIndex: the claim (ClaimChunk) and the lease
// (LeaseChunk) of a long plan walk the index of claimable
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
			"claim": {pgstore.ClaimQuery, []any{run.BatchID, "{}"}},
			"lease": {pgstore.LeaseQuery, []any{run.BatchID, "{}", "k", 30.0}},
		} {
			err := pgstore.InTx(ctx, db, func(tx sqlx.ExtContext) error {
				var plan []string
				if err := sqlx.SelectContext(ctx, tx, &plan, `EXPLAIN (COSTS OFF) `+pm.SQL(q.sql), q.args...); err != nil {
					return err
				}
				p := strings.Join(plan, "\n")
				if !strings.Contains(p, "Index Scan using chunks_claimable on chunks") || strings.Contains(p, "Sort") || strings.Contains(p, "Bitmap Heap Scan on chunks") {
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

// TestStartRunLongPlan: a plan of more chunks than one insert statement
// takes (insertChunksBatch) is recorded whole, each chunk once and in
// order, and resumes as the same run.
func TestStartRunLongPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	if err := pm.Init(ctx, db); err != nil {
		t.Fatal(err)
	}
	n := 2*pgstore.InsertChunksBatch + 3
	ch := IntRange(0, int64(n)*2, 2)
	chunks, err := ch.Chunks(ctx)
	if err != nil || len(chunks) != n {
		t.Fatalf("chunks: %d, %v", len(chunks), err)
	}
	job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	plan := NewPlan(job, TableInfo{Target: job.Target}, chunks)
	run, _, err := pm.StartRun(ctx, db, plan, "w", false)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		N, Seqs, IDs, Bad int
		Min, Max          int
	}
	if err := db.Get(&got, `SELECT count(*) AS n, count(DISTINCT seq) AS seqs, count(DISTINCT chunk_id) AS ids,
		count(*) FILTER (WHERE lo <> seq * 2 OR hi <> seq * 2 + 2 OR chunk_id <> 'int:' || lo || '/' || hi OR status <> 'pending') AS bad,
		min(seq), max(seq) FROM backfill.chunks WHERE batch_id = $1`, run.BatchID); err != nil {
		t.Fatal(err)
	}
	if got.N != n || got.Seqs != n || got.IDs != n || got.Bad != 0 || got.Min != 0 || got.Max != n-1 {
		t.Fatalf("chunks recorded: %+v, want %d in order", got, n)
	}
	again, resumed, err := pm.StartRun(ctx, db, plan, "w", false)
	if err != nil || !resumed || again.BatchID != run.BatchID {
		t.Fatalf("resume: batch %d (want %d), resumed %v, %v", again.BatchID, run.BatchID, resumed, err)
	}
}
