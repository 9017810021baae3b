package backfilltest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestManifest is the conformance suite of [backfilldriver.Manifest].
// newManifest returns a fresh, empty manifest and the database it lives in;
// it is called once per subtest. Both [Manifest] and [backfill.PGManifest]
// pass it; run it against your own implementation too.
func TestManifest(t *testing.T, newManifest func(t *testing.T) (backfill.Manifest, backfill.DB)) {
	t.Helper()
	ctx := context.Background()
	plan := func(t *testing.T, job string, version string, hi int64) backfill.Plan {
		t.Helper()
		ch := backfill.IntRange(0, hi, 10)
		chunks, err := ch.Chunks(ctx)
		require.NoError(t, err)
		info := backfill.TableInfo{Target: backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.Upsert, Duplicates: backfill.KeepLast},
			Columns: []backfill.Column{{Name: "id", Key: true}, {Name: "v"}}}
		return backfill.NewPlan(backfill.Job{Name: job, CodeVersion: version, Chunker: ch}, info, chunks)
	}
	setup := func(t *testing.T) (backfill.Manifest, backfill.DB) {
		t.Helper()
		m, db := newManifest(t)
		require.NoError(t, m.Init(ctx, db))
		require.NoError(t, m.Init(ctx, db), "Init is idempotent")
		return m, db
	}
	claim := func(t *testing.T, m backfill.Manifest, db backfill.DB, batch int64) (backfilldriver.Tx, backfilltype.ChunkState, bool) {
		t.Helper()
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		st, ok, err := m.ClaimChunk(ctx, tx, batch)
		require.NoError(t, err)
		return tx, st, ok
	}
	complete := func(t *testing.T, m backfill.Manifest, tx backfilldriver.Tx, batch int64, st backfilltype.ChunkState, read int64, ex ...backfill.Exception) {
		t.Helper()
		now := time.Now()
		res := backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: read, Inserted: read - int64(len(ex)), Rejected: int64(len(ex))},
			Attempt: 1, StartedAt: now, FinishedAt: now}
		require.NoError(t, m.CompleteChunk(ctx, tx, batch, res, ex))
	}

	t.Run("StartResumeAndPlanChange", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		p := plan(t, "job", "v1", 40)
		run, resumed, err := m.StartRun(ctx, db, p, "w1", false)
		require.NoError(t, err)
		require.False(t, resumed)
		require.Equal(t, backfill.RunRunning, run.Status)
		require.Equal(t, 4, run.ChunksTotal)
		require.Equal(t, "job", run.Job)
		require.Equal(t, p.Fingerprint, run.Fingerprint)
		require.Equal(t, "0", run.ScopeLower)
		require.Equal(t, "40", run.ScopeUpper)

		again, resumed, err := m.StartRun(ctx, db, p, "w2", false)
		require.NoError(t, err)
		require.True(t, resumed)
		require.Equal(t, run.BatchID, again.BatchID)

		_, _, err = m.StartRun(ctx, db, plan(t, "job", "v2", 40), "w1", false)
		require.ErrorIs(t, err, backfill.ErrPlanChanged)
		require.Contains(t, err.Error(), `code_version: "v1" -> "v2"`)

		other, resumed, err := m.StartRun(ctx, db, plan(t, "other-job", "v1", 40), "w1", false)
		require.NoError(t, err, "another job name is independent")
		require.False(t, resumed)
		require.NotEqual(t, run.BatchID, other.BatchID)

		fresh, resumed, err := m.StartRun(ctx, db, plan(t, "job", "v2", 40), "w1", true)
		require.NoError(t, err)
		require.False(t, resumed)
		require.NotEqual(t, run.BatchID, fresh.BatchID)
		chunks, err := m.Chunks(ctx, db, fresh.BatchID)
		require.NoError(t, err)
		require.Len(t, chunks, 4)
		for i, c := range chunks {
			require.Equal(t, i, c.Chunk.Seq)
			require.Equal(t, fmt.Sprintf("int:%d/%d", i*10, i*10+10), c.Chunk.ID)
			require.Equal(t, backfill.ChunkPending, c.Status)
			require.Equal(t, int64(i*10), c.Chunk.Lo)
			require.Equal(t, int64(i*10+10), c.Chunk.Hi)
		}
	})

	t.Run("ClaimsAreExclusiveUntilTheTransactionEnds", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 30), "w", false)
		require.NoError(t, err)
		tx1, st1, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st1.Chunk.Seq)
		tx2, st2, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 1, st2.Chunk.Seq, "a claimed chunk is skipped")
		require.NoError(t, tx1.Rollback())
		tx3, st3, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st3.Chunk.Seq, "a rolled back claim is released")
		tx4, st4, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 2, st4.Chunk.Seq)
		tx5, _, ok := claim(t, m, db, run.BatchID)
		require.False(t, ok, "all chunks claimed")
		for _, tx := range []backfilldriver.Tx{tx2, tx3, tx4, tx5} {
			require.NoError(t, tx.Rollback())
		}
	})

	t.Run("CompletionCommitsWithTheTransaction", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		ex := []backfill.Exception{
			{ChunkID: "int:0/10", Row: 2, Raw: []byte(`{"id":"x"}`), Column: "id", Value: "x", Reason: "invalid"},
			{ChunkID: "int:0/10", Row: 1, Raw: []byte(`{"id":null}`), Column: "id", Value: "NULL", Reason: "missing key"},
		}
		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		complete(t, m, tx, run.BatchID, st, 10, ex...)
		require.NoError(t, tx.Rollback())
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[0].Status, "rolled back completion leaves the chunk pending")
		got, err := m.Exceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Empty(t, got, "rolled back exceptions are gone")

		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st.Chunk.Seq)
		complete(t, m, tx, run.BatchID, st, 10, ex...)
		require.NoError(t, tx.Commit())
		chunks, err = m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkDone, chunks[0].Status)
		require.Equal(t, backfill.Counts{Read: 10, Inserted: 8, Rejected: 2}, chunks[0].Counts)
		require.Equal(t, 1, chunks[0].Attempts)
		require.NotNil(t, chunks[0].FinishedAt)
		got, err = m.Exceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, got, 2)
		require.Equal(t, []int64{1, 2}, []int64{got[0].Row, got[1].Row}, "exceptions in row order")
		require.Equal(t, "missing key", got[0].Reason)
		require.Equal(t, run.BatchID, got[0].BatchID)
		require.JSONEq(t, `{"id":null}`, string(got[0].Raw))

		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 1, st.Chunk.Seq, "a done chunk is not claimed again")
		bad := backfill.ChunkResult{Chunk: st.Chunk, Counts: backfill.Counts{Read: 10, Inserted: 9}}
		require.ErrorIs(t, m.CompleteChunk(ctx, tx, run.BatchID, bad, nil), backfill.ErrAccounting)
		require.NoError(t, tx.Rollback())

		r, err := m.FinishRun(ctx, db, run.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunRunning, r.Status, "not all chunks are done")
		tx, st, _ = claim(t, m, db, run.BatchID)
		complete(t, m, tx, run.BatchID, st, 0)
		require.NoError(t, tx.Commit())
		r, err = m.FinishRun(ctx, db, run.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, r.Status)
		require.NotNil(t, r.FinishedAt)
	})

	t.Run("FailedChunksAreRetriedOnResume", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		p := plan(t, "job", "v1", 20)
		run, _, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		require.NoError(t, m.FailChunk(ctx, db, run.BatchID, 0, "transient", false))
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[0].Status)
		require.Equal(t, 1, chunks[0].Attempts)
		require.Equal(t, "transient", chunks[0].LastError)
		require.NoError(t, m.FailChunk(ctx, db, run.BatchID, 0, "broken", true))
		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 1, st.Chunk.Seq, "a failed chunk is not claimed")
		require.NoError(t, tx.Rollback())
		r, err := m.FinishRun(ctx, db, run.BatchID, true, "chunk 0 broken")
		require.NoError(t, err)
		require.Equal(t, backfill.RunFailed, r.Status)
		require.Equal(t, "chunk 0 broken", r.LastError)

		again, resumed, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		require.True(t, resumed)
		require.Equal(t, run.BatchID, again.BatchID)
		require.Equal(t, backfill.RunRunning, again.Status)
		chunks, err = m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[0].Status)
		require.Equal(t, 2, chunks[0].Attempts)
	})

	t.Run("OpenChunksAreReadAgainByTheNextCall", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		p := plan(t, "job", "v1", 20)
		run, _, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		openAt := func(tx backfilldriver.Tx, st backfilltype.ChunkState, c backfill.Counts, open bool) {
			t.Helper()
			now := time.Now()
			require.NoError(t, m.CompleteChunk(ctx, tx, run.BatchID, backfill.ChunkResult{Chunk: st.Chunk, Counts: c,
				Attempt: 1, StartedAt: now, FinishedAt: now, Open: open}, nil))
			require.NoError(t, tx.Commit())
		}
		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st.Chunk.Seq)
		openAt(tx, st, backfill.Counts{Read: 3, Inserted: 3}, true)
		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 1, st.Chunk.Seq, "an open chunk is not read twice in one call")
		openAt(tx, st, backfill.Counts{Read: 1, Inserted: 1}, false)
		tx, _, ok = claim(t, m, db, run.BatchID)
		require.False(t, ok)
		require.NoError(t, tx.Rollback())
		r, err := m.FinishRun(ctx, db, run.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunRunning, r.Status, "a run with an open chunk is not completed")
		require.NoError(t, m.FailChunk(ctx, db, run.BatchID, 0, "transient", true))
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkOpen, chunks[0].Status, "an open chunk keeps its rows: it stays open")

		_, resumed, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		require.True(t, resumed)
		tx, st, ok = claim(t, m, db, run.BatchID)
		require.True(t, ok)
		require.Equal(t, 0, st.Chunk.Seq, "the next call reads the open chunk again")
		openAt(tx, st, backfill.Counts{Read: 4, Inserted: 1, Unchanged: 3}, false)
		chunks, err = m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkDone, chunks[0].Status)
		require.Equal(t, backfill.Counts{Read: 4, Inserted: 4}, chunks[0].Counts,
			"the chunk's rows as they stand: the latest read's, the 3 rows the first read inserted still inserted")
		r, err = m.FinishRun(ctx, db, run.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, r.Status)
	})

	t.Run("GateEvidenceOutsideTheQueue", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		mg, ok := m.(backfilldriver.ManifestGates)
		mv, ok2 := m.(backfilldriver.ManifestValidations)
		if !ok || !ok2 {
			t.Skip("the manifest keeps no gate evidence")
		}
		p := plan(t, "job", "v1", 20)
		run, _, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		failed := backfill.CheckResult{Check: "c", Severity: backfill.SeverityError, Expected: "0", Actual: "2", Sample: []string{"(1)", "(2)"}}
		bad := []backfill.Exception{{Row: 3, Raw: []byte(`{"id": 3}`), Column: "v", Value: "x", Reason: "bad"}}
		require.NoError(t, mg.RecordGateFailure(ctx, db, backfilltype.GateFailure{
			BatchID: run.BatchID, ChunkID: "int:0/10", Attempt: 1, Results: []backfill.CheckResult{failed}, Exceptions: bad, Reason: "c: expected 0, got 2",
		}))
		r, err := m.(backfilldriver.ManifestAudit).LatestRun(ctx, db, "job")
		require.NoError(t, err)
		require.Equal(t, backfill.RunPaused, r.Status)
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, backfill.ChunkPending, chunks[0].Status)
		require.Equal(t, 1, chunks[0].Attempts, "the rolled back attempt counts")
		vs, err := mv.Validations(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, vs, 1)
		require.Equal(t, 1, vs[0].FailedAttempt)
		require.Equal(t, []string{"(1)", "(2)"}, vs[0].Sample)
		fx, err := mg.FailedAttemptExceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, fx, 1)
		require.Equal(t, 1, fx[0].FailedAttempt)
		require.Equal(t, "int:0/10", fx[0].ChunkID)
		require.Equal(t, "bad", fx[0].Reason)
		require.JSONEq(t, `{"id": 3}`, string(fx[0].Raw))
		queue, err := m.Exceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Empty(t, queue, "evidence is not in the exception queue")
	})

	t.Run("AuditLogAndWatermark", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		audit, ok := m.(backfilldriver.ManifestAudit)
		if !ok {
			t.Skip("the manifest does not implement backfilldriver.ManifestAudit")
		}
		p := plan(t, "job", "v1", 10)
		wm := time.Date(2024, 5, 1, 12, 30, 0, 123456000, time.UTC)
		p.Watermark = &wm
		run, _, err := m.StartRun(ctx, db, p, "w", false)
		require.NoError(t, err)
		require.NotNil(t, run.Watermark)
		require.True(t, wm.Equal(*run.Watermark), "watermark kept to the microsecond")

		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: "job", Kind: "rolled_back_note", Actor: "ann"}))
		require.NoError(t, tx.Rollback())
		tx, err = db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: "job", Kind: "approve", Actor: "bob",
			Detail: []byte(`{"why": "checked by hand"}`)}))
		require.NoError(t, tx.Commit())
		events, err := audit.Events(ctx, db, run.BatchID)
		require.NoError(t, err)
		var kinds []string
		for _, e := range events {
			kinds = append(kinds, e.Kind)
		}
		require.Equal(t, []string{"run_started", "approve"}, kinds, "events of a rolled back transaction are gone")
		require.Equal(t, "bob", events[1].Actor)
		require.JSONEq(t, `{"why": "checked by hand"}`, string(events[1].Detail))

		latest, err := audit.LatestRun(ctx, db, "job")
		require.NoError(t, err)
		require.Equal(t, run.BatchID, latest.BatchID)
		_, err = audit.LatestRun(ctx, db, "job", backfill.RunCompleted)
		require.ErrorIs(t, err, backfill.ErrRunNotFound)
		_, err = audit.LatestRun(ctx, db, "no-such-job")
		require.ErrorIs(t, err, backfill.ErrRunNotFound)
	})

	t.Run("FreeTextIsStoredAsPostgreSQLCan", func(t *testing.T) {
		// Text the library does not control (a Reject's column and reason,
		// an extractor's error, a worker id, an operator's why) may hold
		// invalid UTF-8 or NUL, which PostgreSQL's text and jsonb refuse:
		// recording it must never fail, and every manifest stores it alike
		// (pgstore.ManifestText).
		const bad = "a\xff\x00b"
		want := pgstore.ManifestText(bad)
		require.Equal(t, "a\ufffd\u2400b", want)
		m, db := setup(t)
		run, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 30), "w"+bad, false)
		require.NoError(t, err)
		require.Equal(t, "w"+want, run.Worker)
		tx, st, ok := claim(t, m, db, run.BatchID)
		require.True(t, ok)
		complete(t, m, tx, run.BatchID, st, 1, backfill.Exception{Row: 1, Raw: []byte(`{"v": "\u0000"}`), Column: "c" + bad, Value: bad, Reason: "r" + bad})
		require.NoError(t, tx.Commit())
		got, err := m.Exceptions(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, []string{"c" + want, want, "r" + want}, []string{got[0].Column, got[0].Value, got[0].Reason})
		require.JSONEq(t, `{"v": "\u2400"}`, string(got[0].Raw))
		require.NoError(t, m.FailChunk(ctx, db, run.BatchID, 1, "extract: "+bad, false))
		chunks, err := m.Chunks(ctx, db, run.BatchID)
		require.NoError(t, err)
		require.Equal(t, "extract: "+want, chunks[1].LastError)
		r, err := m.FinishRun(ctx, db, run.BatchID, true, "failed: "+bad)
		require.NoError(t, err)
		require.Equal(t, backfill.RunFailed, r.Status)
		require.Equal(t, "failed: "+want, r.LastError)
		if audit, ok := m.(backfilldriver.ManifestAudit); ok {
			require.NoError(t, audit.RecordEvent(ctx, db, backfilltype.Event{BatchID: run.BatchID, Job: "job", Kind: "note", Actor: "ann" + bad,
				Detail: []byte(`{"why": "x\u0000y", "k\u0000": ["\ud800"]}`)}))
			events, err := audit.Events(ctx, db, run.BatchID)
			require.NoError(t, err)
			last := events[len(events)-1]
			require.Equal(t, "ann"+want, last.Actor)
			require.JSONEq(t, `{"why": "x\u2400y", "k\u2400": ["\ufffd"]}`, string(last.Detail))
		}
		if mg, ok := m.(backfilldriver.ManifestGates); ok {
			res := backfill.CheckResult{Check: "c", Severity: backfill.SeverityError, Expected: "0", Actual: bad, Sample: []string{bad}}
			require.NoError(t, mg.RecordGateFailure(ctx, db, backfilltype.GateFailure{
				BatchID: run.BatchID, ChunkID: "int:20/30", Attempt: 1, Results: []backfill.CheckResult{res},
				Exceptions: []backfill.Exception{{Row: 1, Column: bad, Value: bad, Reason: bad}}, Reason: "gate: " + bad,
			}))
			fx, err := mg.FailedAttemptExceptions(ctx, db, run.BatchID)
			require.NoError(t, err)
			require.Equal(t, []string{want, want, want}, []string{fx[0].Column, fx[0].Value, fx[0].Reason})
			vs, err := m.(backfilldriver.ManifestValidations).Validations(ctx, db, run.BatchID)
			require.NoError(t, err)
			require.Equal(t, want, vs[0].Actual)
			require.Equal(t, []string{want}, vs[0].Sample)
			r, err := m.(backfilldriver.ManifestAudit).LatestRun(ctx, db, "job")
			require.NoError(t, err)
			require.Equal(t, backfill.RunPaused, r.Status)
			require.Contains(t, r.LastError, "gate: "+want)
			require.NoError(t, m.(backfilldriver.ManifestValidations).ResumeRun(ctx, db, run.BatchID, "ann"+bad, "why"+bad))
		}
	})

	t.Run("AbandonedRunsAreNotClaimed", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		old, _, err := m.StartRun(ctx, db, plan(t, "job", "v1", 20), "w", false)
		require.NoError(t, err)
		_, _, err = m.StartRun(ctx, db, plan(t, "job", "v2", 20), "w", true)
		require.NoError(t, err)
		tx, _, ok := claim(t, m, db, old.BatchID)
		require.False(t, ok, "a worker of the abandoned run gets no chunk")
		require.NoError(t, tx.Rollback())
		r, err := m.FinishRun(ctx, db, old.BatchID, false, "")
		require.NoError(t, err)
		require.Equal(t, backfill.RunAbandoned, r.Status)
	})

	t.Run("UnknownBatch", func(t *testing.T) {
		t.Parallel()
		m, db := setup(t)
		_, err := m.FinishRun(ctx, db, 987654, false, "")
		require.ErrorIs(t, err, backfill.ErrRunNotFound)
	})

	testManifestLeases(t, setup, plan)
	testManifestCapabilities(t, setup, plan, claim)
	testManifestSubchunks(t, setup, plan)
}
