package backfilltest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// testManifestCapabilities runs the subtests of [TestManifest] for the
// optional interfaces of a manifest, each skipped when the manifest
// lacks it (as riverdrivertest does for a driver's optional features).
func testManifestCapabilities(t *testing.T,
	setup func(t *testing.T) (backfill.Manifest, backfill.DB),
	plan func(t *testing.T, job, version string, hi int64) backfill.Plan,
	claim func(t *testing.T, m backfill.Manifest, db backfill.DB, batch int64) (backfilldriver.Tx, backfilltype.ChunkState, bool),
) {
	t.Helper()
	ctx := context.Background()

	t.Run("Waits", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		mw, ok := m.(backfilldriver.ManifestWaits)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestWaits")
		}
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		other, _, err := m.StartRun(ctx, db, plan(t, "other", "v1", 20), "w", false)
		require.NoError(t, err)
		got, err := mw.Waits(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Empty(t, got)
		blocker := backfilltype.Blocker{PID: 42, ApplicationName: "app", State: "idle in transaction", Query: "LOCK TABLE t"}
		waits := []backfilltype.Wait{
			{BatchID: run.BatchID, Seq: 1, ChunkID: "c1", Attempt: 1, Try: 1, SQLState: "55P03", Message: "canceling statement due to lock timeout",
				LockTimeout: "100", Waited: 100 * time.Millisecond, Blockers: []backfilltype.Blocker{blocker}, Sleep: time.Second, Worker: "w"},
			{BatchID: other.BatchID, Seq: 0, ChunkID: "x", Attempt: 1, Try: 1, SQLState: "40001"},
			{BatchID: run.BatchID, Seq: 1, ChunkID: "c1", Attempt: 1, Try: 2, SQLState: "57014", StatementTimeout: "300", Waited: 300 * time.Millisecond, Final: true},
		}
		for _, w := range waits {
			require.NoError(t, mw.RecordWait(ctx, db, w))
		}
		got, err = mw.Waits(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, got, 2, "the run's own waits, in the order recorded")
		for i, w := range []backfilltype.Wait{waits[0], waits[2]} {
			require.NotZero(t, got[i].ID)
			require.False(t, got[i].At.IsZero())
			if i > 0 {
				require.Greater(t, got[i].ID, got[i-1].ID)
			}
			got[i].ID, got[i].At = 0, time.Time{}
			if len(w.Blockers) == 0 {
				require.Empty(t, got[i].Blockers)
				got[i].Blockers = nil
			}
			require.Equal(t, w, got[i])
		}
	})

	t.Run("Skips", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		ms, ok := m.(backfilldriver.ManifestSkips)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestSkips")
		}
		p := plan(t, "job", "v1", 20)
		// complete checkpoints the batch's next chunk with fp (committed
		// or rolled back), as skipped ([backfill.ChunkResult.Skipped])
		// when fp's source is "s2".
		complete := func(batch int64, fp backfilldriver.ChunkFingerprints, commit bool) {
			t.Helper()
			tx, st, ok := claim(t, m, db, batch)
			require.True(t, ok)
			now := time.Now()
			res := backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: 3, Unchanged: 3}, Attempt: 1, StartedAt: now, FinishedAt: now,
				Skipped: fp.Source == "s2"}
			require.NoError(t, ms.CompleteChunkFingerprinted(ctx, tx, batch, res, nil, fp))
			if commit {
				require.NoError(t, tx.Commit())
			} else {
				require.NoError(t, tx.Rollback())
			}
		}
		base := func(job, key string, batch int64, chunk string) (backfilldriver.ChunkFingerprints, bool) {
			t.Helper()
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			fp, ok, err := ms.BaseFingerprints(ctx, tx, job, key, batch, chunk)
			require.NoError(t, err)
			return fp, ok
		}
		c0, c1 := p.Chunks[0].ID, p.Chunks[1].ID
		run1, _, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		complete(run1.BatchID, backfilldriver.ChunkFingerprints{SkipKey: "k1", Source: "s1", Target: "t1", Version: "ver1"}, true)
		complete(run1.BatchID, backfilldriver.ChunkFingerprints{SkipKey: "k1"}, true)
		// The base's counts, as checkpointed (complete's result).
		counts := backfill.Counts{Read: 3, Unchanged: 3}
		other := run1.BatchID + 1000 // a batch that is not run1
		fp, ok := base("job", "k1", other, c0)
		require.True(t, ok)
		require.Equal(t, backfilldriver.ChunkFingerprints{BatchID: run1.BatchID, SkipKey: "k1", Source: "s1", Target: "t1", Version: "ver1", Counts: counts,
			Seq: p.Chunks[0].Seq}, fp, "the fingerprints, the version, the base's counts and seq, not skipped")
		_, ok = base("job", "k1", other, c1)
		require.False(t, ok, "a chunk checkpointed without fingerprints")
		_, ok = base("job", "k1", run1.BatchID, c0)
		require.False(t, ok, "the asking batch's own chunk is no base")
		_, ok = base("other", "k1", other, c0)
		require.False(t, ok, "another job")
		_, ok = base("job", "k2", other, c0)
		require.False(t, ok, "another skip key")
		_, ok = base("job", "", other, c0)
		require.False(t, ok, "no skip key")

		// A run of another scope (more chunks, another plan fingerprint)
		// with the same skip key: its chunk of the same ID is the newest
		// base.
		p2 := plan(t, "job", "v1", 30)
		require.NotEqual(t, p.Fingerprint, p2.Fingerprint)
		run2, _, err := m.StartRun(ctx, db, p2, "w", true)
		require.NoError(t, err)
		complete(run2.BatchID, backfilldriver.ChunkFingerprints{SkipKey: "k1", Source: "s2", Target: "t2"}, false)
		fp, ok = base("job", "k1", other, c0)
		require.True(t, ok)
		require.Equal(t, run1.BatchID, fp.BatchID, "a checkpoint rolled back records nothing")
		complete(run2.BatchID, backfilldriver.ChunkFingerprints{SkipKey: "k1", Source: "s2", Target: "t2"}, true)
		fp, ok = base("job", "k1", other, c0)
		require.True(t, ok)
		seq2 := slices.IndexFunc(p2.Chunks, func(c backfill.Chunk) bool { return c.ID == c0 })
		require.Equal(t, backfilldriver.ChunkFingerprints{BatchID: run2.BatchID, SkipKey: "k1", Source: "s2", Target: "t2", Counts: counts,
			Seq: p2.Chunks[seq2].Seq, Skipped: true}, fp,
			"the newest done chunk, whatever its run's scope; recorded without a version, none; its seq, skipped")
		fp, ok = base("job", "k1", run2.BatchID, c0)
		require.True(t, ok)
		require.Equal(t, run1.BatchID, fp.BatchID)
		require.Equal(t, "ver1", fp.Version)
		// The skipped marker: on the chunk's state, as checkpointed.
		for batch, want := range map[int64][]bool{run1.BatchID: {false, false}, run2.BatchID: {true, false, false}} {
			states, err := m.Chunks(ctx, db, batch)
			require.NoError(t, err)
			var got []bool
			for _, st := range states {
				got = append(got, st.Skipped)
			}
			require.Equal(t, want, got[:len(want)], "batch %d", batch)
		}
		// The newest chunk of the key recorded no fingerprints: no base,
		// never an older one.
		run3, _, err := m.StartRun(ctx, db, p, "w", true)
		require.NoError(t, err)
		complete(run3.BatchID, backfilldriver.ChunkFingerprints{SkipKey: "k1"}, true)
		_, ok = base("job", "k1", other, c0)
		require.False(t, ok, "the newest chunk of the key recorded no fingerprints")

		mr, ok := m.(backfilldriver.ManifestRollback)
		if !ok {
			return
		}
		for _, batch := range []int64{run3.BatchID, run2.BatchID} {
			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			done, err := mr.RollBackChunk(ctx, tx, batch, 0)
			require.NoError(t, err)
			require.True(t, done)
			require.NoError(t, tx.Commit())
		}
		fp, ok = base("job", "k1", other, c0)
		require.True(t, ok)
		require.Equal(t, run1.BatchID, fp.BatchID, "a rolled back chunk is no base")
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, mr.RollBackRun(ctx, tx, run1.BatchID))
		require.NoError(t, tx.Commit())
		_, ok = base("job", "k1", other, c0)
		require.False(t, ok, "a rolled back run is no base")
	})

	t.Run("PauseAndResume", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		mv, ok := m.(backfilldriver.ManifestValidations)
		audit, ok2 := m.(backfilldriver.ManifestAudit)
		if !ok || !ok2 {
			t.Skip("the manifest does not implement backfilldriver.ManifestValidations and backfilldriver.ManifestAudit")
		}
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		require.ErrorIs(t, mv.ResumeRun(ctx, db, run.BatchID, "ann", "why"), backfill.ErrNotPaused, "a running run is not paused")

		require.NoError(t, mv.PauseRun(ctx, db, run.BatchID, "gate c failed"))
		latest, err := audit.LatestRun(ctx, db, "job")
		require.NoError(t, err)
		require.Equal(t, backfill.RunPaused, latest.Status)
		require.Equal(t, "gate c failed", latest.LastError)
		tx, _, ok := claim(t, m, db, run.BatchID)
		require.False(t, ok, "a paused run gives no chunk")
		require.NoError(t, tx.Rollback())
		again, resumed, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		require.Equal(t, run.BatchID, again.BatchID, "StartRun returns the paused run")
		require.Equal(t, backfill.RunPaused, again.Status)
		require.True(t, resumed)

		require.NoError(t, mv.ResumeRun(ctx, db, run.BatchID, "ann", "fixed the source"))
		latest, err = audit.LatestRun(ctx, db, "job")
		require.NoError(t, err)
		require.Equal(t, backfill.RunRunning, latest.Status)
		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok, "a resumed run gives chunks again")
		require.Equal(t, 0, st.Chunk.Seq)
		require.NoError(t, tx.Rollback())
		events, err := audit.Events(ctx, db, run.BatchID)
		require.NoError(t, err)
		var resumedBy []string
		for _, e := range events {
			if e.Kind == "run_resumed_by_operator" {
				resumedBy = append(resumedBy, e.Actor)
				// The reason, and the rows the resume accepts (none read yet).
				require.JSONEq(t, `{"why": "fixed the source", "read": 0, "rejected": 0}`, string(e.Detail))
			}
		}
		require.Equal(t, []string{"ann"}, resumedBy, "who resumed and why are in the audit log")
	})

	t.Run("ValidationsCommitWithTheTransaction", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		mv, ok := m.(backfilldriver.ManifestValidations)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestValidations")
		}
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		lost := backfill.CheckResult{Check: "lost", Severity: backfill.SeverityError, Passed: true, Expected: "1", Actual: "1"}
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, mv.AddValidations(ctx, tx, run.BatchID, "int:0/10", []backfill.CheckResult{lost}))
		require.NoError(t, tx.Rollback())
		kept := []backfill.CheckResult{
			{Check: "count", Severity: backfill.SeverityError, Passed: true, Expected: "10", Actual: "10"},
			{Check: "sum", Severity: backfill.SeverityWarn, Passed: false, Expected: "5", Actual: "6", Sample: []string{"(3)"}},
		}
		tx, err = db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, mv.AddValidations(ctx, tx, run.BatchID, "int:10/20", kept))
		require.NoError(t, tx.Commit())
		vs, err := mv.Validations(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, vs, 2, "results of a rolled back transaction are gone")
		for i, v := range vs {
			require.Equal(t, "int:10/20", v.ChunkID)
			require.Equal(t, kept[i].Check, v.Check, "in the order recorded")
			require.Equal(t, kept[i].Passed, v.Passed)
			require.Equal(t, kept[i].Severity, v.Severity)
			require.Equal(t, kept[i].Expected, v.Expected)
			require.Equal(t, kept[i].Actual, v.Actual)
		}
		require.Equal(t, []string{"(3)"}, vs[1].Sample)
	})

	t.Run("StagedChunks", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		ms, ok := m.(backfilldriver.ManifestStaging)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestStaging")
		}
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		require.NotEmpty(t, ms.StagingTable(run.BatchID))
		require.Equal(t, ms.StagingTable(run.BatchID), ms.StagingTable(run.BatchID), "the staging table's name is stable")
		bad := []backfill.Exception{{ChunkID: "int:0/10", Row: 4, Raw: []byte(`{"id": 4}`), Column: "v", Value: "x", Reason: "bad"}}

		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.ErrorIs(t, ms.StageChunk(ctx, tx, backfilldriver.StageChunkParams{BatchID: run.BatchID, Chunk: st.Chunk, Read: 10, Rejected: 1, Staged: 8, Exceptions: bad}), backfill.ErrAccounting)
		require.NoError(t, tx.Rollback())
		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.NoError(t, ms.StageChunk(ctx, tx, backfilldriver.StageChunkParams{BatchID: run.BatchID, Chunk: st.Chunk, Read: 10, Rejected: 1, Staged: 9, Exceptions: bad}))
		require.NoError(t, tx.Rollback())
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[0].Status, "a rolled back stage leaves the chunk pending")

		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st.Chunk.Seq)
		require.NoError(t, ms.StageChunk(ctx, tx, backfilldriver.StageChunkParams{BatchID: run.BatchID, Chunk: st.Chunk, Read: 10, Rejected: 1, Staged: 9, Exceptions: bad}))
		require.NoError(t, tx.Commit())
		chunks, err = m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkStatus("staged"), chunks[0].Status)
		require.Equal(t, int64(10), chunks[0].Read)
		require.Equal(t, int64(1), chunks[0].Rejected)
		queue, err := m.Exceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, queue, 1, "a staged chunk's exceptions are queued")
		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 1, st.Chunk.Seq, "a staged chunk is not claimed again")
		require.NoError(t, tx.Rollback())
		r, err := m.FinishRun(ctx, db, run.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunRunning, r.Status, "a staged chunk is not done")

		tx, err = db.Begin(ctx)
		require.NoError(t, err)
		staged, err := ms.StagedChunks(ctx, tx, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, []backfilldriver.StagedChunk{{Seq: 0, Read: 10, Rejected: 1, Staged: 9}}, staged)
		res := backfill.ChunkResult{Chunk: chunks[0].Chunk, Attempt: 1, Counts: backfill.Counts{Read: 10, Inserted: 9, Rejected: 1}}
		require.NoError(t, m.CompleteChunk(ctx, tx, run.BatchID, res, nil), "the publish completes a staged chunk")
		require.NoError(t, tx.Commit())
		chunks, err = m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkDone, chunks[0].Status)
		require.Equal(t, backfill.Counts{Read: 10, Inserted: 9, Rejected: 1}, chunks[0].Counts)
		tx, err = db.Begin(ctx)
		require.NoError(t, err)
		staged, err = ms.StagedChunks(ctx, tx, run.BatchID)
		require.NoError(t, err)
		require.Empty(t, staged)
		require.NoError(t, tx.Rollback())
	})

	t.Run("UndoLogTables", func(t *testing.T) {
		t.Parallel()
		m, _ := setup(t)
		mu, ok := m.(backfilldriver.ManifestUndoLog)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestUndoLog")
		}
		require.NotEmpty(t, mu.UndoTable())
		require.NotEmpty(t, mu.DeliveredTable())
		require.NotEqual(t, mu.UndoTable(), mu.DeliveredTable())
		require.Equal(t, mu.UndoTable(), mu.UndoTable(), "stable")
	})
}

// testMergerCapabilities runs the subtests of [TestMerger] for the
// optional interfaces of a merger, each skipped when the merger lacks it.
func testMergerCapabilities(t *testing.T, newHarness func(t *testing.T) MergerHarness) {
	t.Helper()
	ctx := context.Background()

	t.Run("PersistentStaging", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		ms, ok := h.Merger.(backfilldriver.MergerStaging)
		if !ok {
			t.Skip("the merger does not implement backfilldriver.MergerStaging")
		}
		h.CreateTable(t, "items", itemsDef, []string{"tenant", "id"})
		info, err := h.Merger.Prepare(ctx, h.DB, backfill.Target{Table: "items", Key: []string{"tenant", "id"}, Columns: []string{"tenant", "id", "name"}})
		require.NoError(t, err)
		const table = "staging_conformance"
		require.NoError(t, ms.CreateStaging(ctx, h.DB, table, info))
		require.NoError(t, ms.CreateStaging(ctx, h.DB, table, info), "CreateStaging is idempotent")
		stage := func(t *testing.T, commit bool, seq int, rows ...[]any) {
			t.Helper()
			tx, err := h.DB.Begin(ctx)
			require.NoError(t, err)
			st, err := ms.StagePersistent(ctx, tx, table, info, seq)
			require.NoError(t, err)
			for i, r := range rows {
				require.NoError(t, st.Add(ctx, int64(i+1), r))
			}
			res, err := st.Merge(ctx)
			require.NoError(t, err)
			require.Equal(t, backfilltype.MergeResult{}, res, "staging merges nothing")
			require.Equal(t, int64(len(rows)), st.Staged())
			require.NoError(t, st.Close())
			if commit {
				require.NoError(t, tx.Commit())
			} else {
				require.NoError(t, tx.Rollback())
			}
		}
		chunk0 := [][]any{{"a", int64(1), "x"}, {"a", int64(1), "y"}, {"b", int64(2), "z"}}
		stage(t, false, 0, chunk0...)
		stage(t, true, 0, chunk0...)
		stage(t, true, 1, []any{"c", int64(3), "w"})
		require.Empty(t, h.Rows(t, "items"), "staged rows are not in the target")

		tx, err := h.DB.Begin(ctx)
		require.NoError(t, err)
		_, err = ms.StageFrom(ctx, tx, info, table, 0, 2)
		require.ErrorIs(t, err, backfill.ErrAccounting, "the rolled back staging kept nothing: 3 rows, not 2 (or 6)")
		require.NoError(t, tx.Rollback())

		tx, err = h.DB.Begin(ctx)
		require.NoError(t, err)
		var got []backfilltype.MergeResult
		for seq, n := range []int64{3, 1} {
			st, err := ms.StageFrom(ctx, tx, info, table, seq, n)
			require.NoError(t, err)
			res, err := st.Merge(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Close())
			got = append(got, res)
		}
		require.NoError(t, ms.DropStaging(ctx, tx, table))
		require.NoError(t, tx.Commit())
		require.Equal(t, []backfilltype.MergeResult{{Inserted: 2, Deduplicated: 1}, {Inserted: 1}}, got)
		require.Equal(t, [][]any{{"a", int64(1), "y"}, {"b", int64(2), "z"}, {"c", int64(3), "w"}}, sortRows(h.Rows(t, "items")))
	})
}
