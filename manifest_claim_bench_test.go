package backfill

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// BenchmarkClaimDone: a claim (ClaimChunk in a transaction rolled back)
// and a lease (LeaseChunk, then ReleaseLease) of a run whose chunks are
// all done but the last 10 (set done in one UPDATE, so the index of
// claimable chunks still holds their dead entries), at 1,000, 100,000
// and 1,000,000 chunks (CLAIM_SIZES=n,... for others); then the same
// after a VACUUM of the chunks table (-vacuumed). It also logs what the
// plan and StartRun cost (time, allocations, heap in use with the plan
// held). Reports only (ns/op); CLAIM_EXPLAIN=1 logs the claim's plan.
//
//	go test -run '^$' -bench BenchmarkClaimDone -benchtime 20x -v .
func BenchmarkClaimDone(b *testing.B) {
	sizes := []int{1_000, 100_000, 1_000_000}
	if s := os.Getenv("CLAIM_SIZES"); s != "" { // e.g. CLAIM_SIZES=100000
		sizes = sizes[:0]
		for _, f := range strings.Split(s, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil || n < 20 {
				b.Fatalf("CLAIM_SIZES: %q", f)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.New(b)
			pm := NewPGManifest("")
			if err := pm.Init(ctx, db); err != nil {
				b.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			begin := time.Now()
			ch := IntRange(0, int64(n), 1)
			chunks, err := ch.Chunks(ctx)
			if err != nil {
				b.Fatal(err)
			}
			job := Job{Name: "long", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
			run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
			if err != nil {
				b.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			b.Logf("%d chunks: plan and StartRun %v, %.1f MiB allocated, heap in use %.1f MiB",
				n, time.Since(begin).Round(time.Millisecond), float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), float64(after.HeapInuse)/(1<<20))
			explain := func(when string) {
				if os.Getenv("CLAIM_EXPLAIN") == "" {
					return
				}
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				var plan []string
				if err := sqlx.SelectContext(ctx, tx, &plan, `EXPLAIN (ANALYZE, BUFFERS) `+pm.SQL(pgstore.ClaimQuery), run.BatchID, "{}"); err != nil {
					b.Fatal(err)
				}
				b.Log(when + ":\n" + strings.Join(plan, "\n"))
			}
			explain("all pending")
			if _, err := db.Exec(`UPDATE backfill.chunks SET status = 'done' WHERE batch_id = $1 AND seq < $2`, run.BatchID, n-10); err != nil {
				b.Fatal(err)
			}
			claim := func() {
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				st, ok, err := pm.ClaimChunk(ctx, tx, run.BatchID)
				if err != nil || !ok || st.Chunk.Seq != n-10 {
					b.Fatalf("claim: %v %v %+v", ok, err, st.Chunk)
				}
			}
			claim() // the first scan marks the done chunks' index entries dead
			explain("done")
			b.Run("claim", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					claim()
				}
			})
			lease := func(b *testing.B) {
				l := backfilldriver.Lease{Key: "k", StaleAfter: 30 * time.Second, JobConcurrency: 4}
				for i := 0; i < b.N; i++ {
					cl, ok, _, err := pm.LeaseChunk(ctx, db, run.BatchID, l)
					if err != nil || !ok {
						b.Fatalf("lease: %v %v", ok, err)
					}
					if err := pm.ReleaseLease(ctx, db, run.BatchID, cl.State.Chunk.Seq, "k", cl.Epoch); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("lease", lease)
			// What the autovacuum does to the table as done chunks
			// accumulate: the done chunks' entries leave the index.
			if _, err := db.Exec(`VACUUM backfill.chunks`); err != nil {
				b.Fatal(err)
			}
			b.Run("claim-vacuumed", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					claim()
				}
			})
			b.Run("lease-vacuumed", lease)
		})
	}
}
