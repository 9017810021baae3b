package backfilltest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// testManifestLeases runs the subtests of [TestManifest] for
// [backfilldriver.ManifestLeases], which a Runner requires: leases,
// fences, releases, take-overs of stale leases, the job-wide cap on live
// leases, and the holders of chunks in flight.
func testManifestLeases(t *testing.T,
	setup func(t *testing.T) (backfill.Manifest, backfill.DB),
	plan func(t *testing.T, job, version string, hi int64) backfill.Plan,
) {
	t.Helper()
	ctx := context.Background()
	// start returns the manifest as ManifestLeases, its database and a
	// running run of hi/10 chunks, with workers keys registered (stale
	// after stale).
	start := func(t *testing.T, hi int64, stale time.Duration, keys ...string) (backfilldriver.ManifestLeases, backfill.Manifest, backfill.DB, int64) {
		t.Helper()
		m, db := setup(t)
		ml, ok := m.(backfilldriver.ManifestLeases)
		require.True(t, ok, "the manifest does not implement backfilldriver.ManifestLeases, which a Runner requires")
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", hi), "w", false)
		require.NoError(t, err)
		for _, k := range keys {
			require.NoError(t, ml.RegisterWorker(ctx, db, backfilltype.Worker{Key: k, ID: "worker " + k, BatchID: run.BatchID, Job: "job",
				Host: "host", PID: 7, StaleAfter: stale}))
		}
		return ml, m, db, run.BatchID
	}
	lease := func(t *testing.T, ml backfilldriver.ManifestLeases, db backfill.DB, batch int64, l backfilldriver.Lease) (backfilldriver.ChunkLease, bool, bool) {
		t.Helper()
		cl, ok, full, err := ml.LeaseChunk(ctx, db, batch, l)
		require.NoError(t, err)
		return cl, ok, full
	}
	// fence begins a chunk transaction and fences seq at epoch in it.
	fence := func(t *testing.T, ml backfilldriver.ManifestLeases, db backfill.DB, batch int64, seq int, epoch int64, l backfilldriver.Lease) (backfilldriver.Tx, backfilltype.ChunkState, bool) {
		t.Helper()
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		st, _, ok, err := ml.FenceLease(ctx, tx, batch, seq, epoch, l)
		require.NoError(t, err)
		return tx, st, ok
	}
	complete := func(t *testing.T, m backfill.Manifest, tx backfilldriver.Tx, batch int64, st backfilltype.ChunkState) {
		t.Helper()
		now := time.Now()
		require.NoError(t, m.CompleteChunk(ctx, tx, batch, backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: 1, Inserted: 1},
			Attempt: 1, StartedAt: now, FinishedAt: now}, nil))
		require.NoError(t, tx.Commit())
	}
	statuses := func(t *testing.T, m backfill.Manifest, db backfill.DB, batch int64) []backfill.ChunkStatus {
		t.Helper()
		chunks, err := m.Chunks(ctx, db, batch)
		require.NoError(t, err)
		out := make([]backfill.ChunkStatus, len(chunks))
		for i, c := range chunks {
			out[i] = c.Status
		}
		return out
	}
	const long = time.Minute // a stale bound no test outlives

	t.Run("Leases/LeaseThenFence", func(t *testing.T) {
		t.Parallel()
		ml, m, db, batch := start(t, 20, long, "a")
		la := backfilldriver.Lease{Key: "a", StaleAfter: long}
		cl, ok, full := lease(t, ml, db, batch, la)
		require.True(t, ok)
		require.False(t, full)
		require.Equal(t, 0, cl.State.Chunk.Seq, "the lowest-Seq claimable chunk")
		require.Equal(t, backfill.ChunkPending, cl.State.Status)
		require.Equal(t, backfill.RunRunning, cl.Control.Status, "the run's control state comes with the lease")
		require.NotNil(t, cl.Control.Knobs)

		tx, _, ok := fence(t, ml, db, batch, 0, cl.Epoch+1, la)
		require.False(t, ok, "another epoch does not fence")
		require.NoError(t, tx.Rollback())
		tx, _, ok = fence(t, ml, db, batch, 0, cl.Epoch, backfilldriver.Lease{Key: "b", StaleAfter: long})
		require.False(t, ok, "another key does not fence")
		require.NoError(t, tx.Rollback())

		tx, st, ok := fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.True(t, ok)
		require.Equal(t, 0, st.Chunk.Seq)
		require.Equal(t, backfill.ChunkPending, st.Status)
		require.NoError(t, tx.Rollback())
		_, ok, _ = lease(t, ml, db, batch, backfilldriver.Lease{Key: "b", StaleAfter: long, Avoid: []int{1}})
		require.False(t, ok, "a fence rolled back leaves the lease to its key")

		tx, st, ok = fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.True(t, ok, "the lease survives a rolled back fence")
		complete(t, m, tx, batch, st)
		require.Equal(t, []backfill.ChunkStatus{backfill.ChunkDone, backfill.ChunkPending}, statuses(t, m, db, batch))
		next, ok, _ := lease(t, ml, db, batch, backfilldriver.Lease{Key: "b", StaleAfter: long})
		require.True(t, ok)
		require.Equal(t, 1, next.State.Chunk.Seq, "a committed chunk is not leased again")
		hs, err := ml.Holders(ctx, db, batch, "a", long, false, true)
		require.NoError(t, err)
		require.Len(t, hs, 1, "the commit ended the lease of chunk 0: %+v", hs)
		require.Equal(t, 1, hs[0].Seq)
	})

	t.Run("Leases/ASecondKeyCannotLeaseALeasedChunk", func(t *testing.T) {
		t.Parallel()
		ml, _, db, batch := start(t, 10, long, "a", "b")
		require.Error(t, ml.RegisterWorker(ctx, db, backfilltype.Worker{Key: "a", ID: "again", BatchID: batch, Job: "job", StaleAfter: long}),
			"a key registers once")
		require.NoError(t, ml.Heartbeat(ctx, db, "nobody"), "a heartbeat of an unknown key changes nothing")
		la, lb := backfilldriver.Lease{Key: "a", StaleAfter: long}, backfilldriver.Lease{Key: "b", StaleAfter: long}
		first, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok)
		_, ok, full := lease(t, ml, db, batch, lb)
		require.False(t, ok, "the only chunk is leased by a live worker")
		require.False(t, full)
		_, ok, _ = lease(t, ml, db, batch, backfilldriver.Lease{Key: "a", StaleAfter: long, Avoid: []int{0}})
		require.False(t, ok, "an avoided chunk is not leased")

		hs, err := ml.Holders(ctx, db, batch, "b", long, false, true)
		require.NoError(t, err)
		require.Len(t, hs, 1)
		require.Equal(t, backfilldriver.ChunkHolder{Seq: 0, ChunkID: "int:0/10", WorkerKey: "a", WorkerID: "worker a", Host: "host", OSPID: 7,
			AgeSec: hs[0].AgeSec}, hs[0], "the holder, with its registration")
		require.GreaterOrEqual(t, hs[0].AgeSec, 0.0)
		hs, err = ml.Holders(ctx, db, batch, "a", long, false, true)
		require.NoError(t, err)
		require.Empty(t, hs, "a worker's own leases are not held by others")

		again, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok, "a key leases its own lease again")
		require.Equal(t, 0, again.State.Chunk.Seq)
		require.Equal(t, first.Epoch+1, again.Epoch, "with a new epoch")
		tx, _, ok := fence(t, ml, db, batch, 0, first.Epoch, la)
		require.False(t, ok, "the earlier epoch no longer fences")
		require.NoError(t, tx.Rollback())
		tx, _, ok = fence(t, ml, db, batch, 0, again.Epoch, la)
		require.True(t, ok)
		require.NoError(t, tx.Rollback())
	})

	t.Run("Leases/ReleaseMakesTheChunkClaimable", func(t *testing.T) {
		t.Parallel()
		ml, _, db, batch := start(t, 10, long, "a", "b")
		la, lb := backfilldriver.Lease{Key: "a", StaleAfter: long}, backfilldriver.Lease{Key: "b", StaleAfter: long}
		cl, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok)
		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 0, "a", cl.Epoch+1))
		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 0, "b", cl.Epoch))
		_, ok, _ = lease(t, ml, db, batch, lb)
		require.False(t, ok, "a release of another epoch or key leaves the lease alone")

		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 0, "a", cl.Epoch))
		hs, err := ml.Holders(ctx, db, batch, "b", long, false, true)
		require.NoError(t, err)
		require.Empty(t, hs)
		got, ok, _ := lease(t, ml, db, batch, lb)
		require.True(t, ok, "a released chunk is claimable")
		require.Equal(t, 0, got.State.Chunk.Seq)
		require.Greater(t, got.Epoch, cl.Epoch)
		tx, _, ok := fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.False(t, ok, "the released lease does not fence")
		require.NoError(t, tx.Rollback())
	})

	t.Run("Leases/AStaleLeaseIsTakenOver", func(t *testing.T) {
		t.Parallel()
		const stale = 2 * time.Second
		ml, m, db, batch := start(t, 10, stale, "a", "b")
		la, lb := backfilldriver.Lease{Key: "a", StaleAfter: stale}, backfilldriver.Lease{Key: "b", StaleAfter: stale}
		cl, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok)
		// Older than the stale bound, but its worker heartbeats: live.
		time.Sleep(stale * 6 / 10)
		require.NoError(t, ml.Heartbeat(ctx, db, "a"))
		time.Sleep(stale * 6 / 10)
		_, ok, _ = lease(t, ml, db, batch, lb)
		require.False(t, ok, "a lease whose worker heartbeats is live")
		// Its worker stopped heartbeating: stale, taken over.
		time.Sleep(stale * 6 / 10)
		got, ok, _ := lease(t, ml, db, batch, lb)
		require.True(t, ok, "a stale lease is taken over")
		require.Equal(t, 0, got.State.Chunk.Seq)
		require.Greater(t, got.Epoch, cl.Epoch, "with a higher epoch")

		tx, _, ok := fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.False(t, ok, "the old key's fence fails: its lease was taken over")
		require.NoError(t, tx.Rollback())
		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 0, "a", cl.Epoch))
		tx, st, ok := fence(t, ml, db, batch, 0, got.Epoch, lb)
		require.True(t, ok, "the old key's release left the new lease alone")
		complete(t, m, tx, batch, st)
		require.Equal(t, []backfill.ChunkStatus{backfill.ChunkDone}, statuses(t, m, db, batch))
	})

	t.Run("Leases/AFinishedWorkersLeaseLastsItsStaleBound", func(t *testing.T) {
		t.Parallel()
		const stale = time.Second
		ml, _, db, batch := start(t, 10, long, "a", "b")
		_, ok, _ := lease(t, ml, db, batch, backfilldriver.Lease{Key: "a", StaleAfter: stale})
		require.True(t, ok)
		require.NoError(t, ml.FinishWorker(ctx, db, "a"))
		lb := backfilldriver.Lease{Key: "b", StaleAfter: stale}
		_, ok, _ = lease(t, ml, db, batch, lb)
		require.False(t, ok, "younger than the asker's stale bound: live")
		require.Eventually(t, func() bool {
			_, ok, _ := lease(t, ml, db, batch, lb)
			return ok
		}, 10*stale, stale/10, "a finished worker's lease is taken over once older than the asker's stale bound")
	})

	t.Run("Leases/JobConcurrencyCapsLiveLeases", func(t *testing.T) {
		t.Parallel()
		ml, m, db, batch := start(t, 40, long, "a", "b", "c")
		capped := func(key string) backfilldriver.Lease {
			return backfilldriver.Lease{Key: key, StaleAfter: long, JobConcurrency: 2}
		}
		a, ok, _ := lease(t, ml, db, batch, capped("a"))
		require.True(t, ok)
		b, ok, _ := lease(t, ml, db, batch, capped("b"))
		require.True(t, ok)
		require.Equal(t, []int{0, 1}, []int{a.State.Chunk.Seq, b.State.Chunk.Seq})
		_, ok, full := lease(t, ml, db, batch, capped("c"))
		require.False(t, ok)
		require.True(t, full, "two live leases: the cap is reached")
		c2, ok, full := lease(t, ml, db, batch, backfilldriver.Lease{Key: "c", StaleAfter: long})
		require.True(t, ok, "without a cap")
		require.False(t, full)
		require.Equal(t, 2, c2.State.Chunk.Seq)

		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 0, "a", a.Epoch))
		_, _, full = lease(t, ml, db, batch, capped("a"))
		require.True(t, full, "chunks 1 and 2 hold live leases")
		require.NoError(t, ml.ReleaseLease(ctx, db, batch, 2, "c", c2.Epoch))
		c, ok, full := lease(t, ml, db, batch, capped("c"))
		require.True(t, ok, "a release frees a place")
		require.False(t, full)
		require.Equal(t, 0, c.State.Chunk.Seq)

		tx, st, ok := fence(t, ml, db, batch, 1, b.Epoch, capped("b"))
		require.True(t, ok)
		_, _, full = lease(t, ml, db, batch, capped("a"))
		require.True(t, full, "a fenced chunk holds its place until its transaction ends")
		complete(t, m, tx, batch, st)
		d, ok, full := lease(t, ml, db, batch, capped("a"))
		require.True(t, ok, "the commit of a fenced chunk frees its place")
		require.False(t, full)
		require.Equal(t, 2, d.State.Chunk.Seq)
	})

	t.Run("Leases/AFencedChunkIsInFlight", func(t *testing.T) {
		t.Parallel()
		ml, m, db, batch := start(t, 10, long, "a", "b")
		la := backfilldriver.Lease{Key: "a", StaleAfter: long}
		cl, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok)
		tx, st, ok := fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.True(t, ok)
		_, ok, _ = lease(t, ml, db, batch, backfilldriver.Lease{Key: "a", StaleAfter: long})
		require.False(t, ok, "a fenced chunk is locked by its transaction, also for its key")
		hs, err := ml.Holders(ctx, db, batch, "b", long, true, true)
		require.NoError(t, err)
		require.NotEmpty(t, hs)
		for _, h := range hs {
			require.Equal(t, 0, h.Seq)
			require.Equal(t, "a", h.WorkerKey)
			require.False(t, h.Stale || h.Terminated, "a live worker is not fenced")
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		fw := backfilldriver.FenceWait{StaleAfter: long, Poll: 20 * time.Millisecond, What: "test"}
		require.Error(t, ml.WaitInFlight(wctx, db, batch, fw), "the fenced chunk is in flight until its transaction ends")
		complete(t, m, tx, batch, st)
		require.NoError(t, ml.WaitInFlight(ctx, db, batch, fw))
	})

	t.Run("Leases/AStaleTransactionHolderIsFenced", func(t *testing.T) {
		t.Parallel()
		const stale = time.Second
		ml, m, db, batch := start(t, 10, stale, "a", "b")
		la := backfilldriver.Lease{Key: "a", StaleAfter: stale}
		cl, ok, _ := lease(t, ml, db, batch, la)
		require.True(t, ok)
		tx, st, ok := fence(t, ml, db, batch, 0, cl.Epoch, la)
		require.True(t, ok)
		defer func() { _ = tx.Rollback() }()
		// Worker a stops heartbeating while its transaction holds the
		// chunk: b's Holders with fence ends that transaction.
		time.Sleep(stale * 12 / 10)
		hs, err := ml.Holders(ctx, db, batch, "b", stale, true, true)
		require.NoError(t, err)
		var terminated bool
		for _, h := range hs {
			require.Equal(t, 0, h.Seq)
			terminated = terminated || h.Stale && h.Terminated
		}
		require.True(t, terminated, "the stale holder's transaction is ended: %+v", hs)
		require.Eventually(t, func() bool {
			got, ok, _ := lease(t, ml, db, batch, backfilldriver.Lease{Key: "b", StaleAfter: stale})
			return ok && got.State.Chunk.Seq == 0 && got.Epoch > cl.Epoch
		}, 10*time.Second, 50*time.Millisecond, "the fenced chunk is taken over")
		now := time.Now()
		err = m.CompleteChunk(ctx, tx, batch, backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: 1, Inserted: 1},
			Attempt: 1, StartedAt: now, FinishedAt: now}, nil)
		require.Error(t, errors.Join(err, tx.Commit()), "the fenced worker cannot commit the chunk")
	})
}
