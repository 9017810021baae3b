package backfill_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// opsSource is a mutable source of (id, at, amount) rows, written in id
// order for the chunk that contains at.
type opsSource struct {
	mu   sync.Mutex
	rows map[int64][2]any
}

func (s *opsSource) set(id int64, at time.Time, amount any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rows == nil {
		s.rows = map[int64][2]any{}
	}
	s.rows[id] = [2]any{at, amount}
}

func (s *opsSource) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := int64(0); id < 100; id++ {
		if r, ok := s.rows[id]; ok && c.Contains(r[0].(time.Time)) {
			if err := w.Write(ctx, id, r[0], r[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// opsJob is a job over today (open: it ends tomorrow) and, with days 2,
// yesterday too, into table ev (id, at, amount).
func opsJob(src *opsSource, days int) backfill.Job {
	today := time.Now().UTC().Truncate(24 * time.Hour)
	return backfill.Job{Name: "ev", Chunker: backfill.Days(today.Add(-time.Duration(days-1)*24*time.Hour), today.Add(24*time.Hour), time.UTC),
		ChunkColumn: "at", Extractor: src, Target: backfill.Target{Table: "ev", Key: []string{"id"}, Columns: []string{"id", "at", "amount"}}}
}

// TestOpenChunkReadAgainDescribesTheChunk: a 21-row open chunk with one
// bad row, read four times, counts 21 rows and one reject, with one
// exception row, balanced; rows the first read inserted stay inserted.
// On the starting commit it reported Read 84, Rejected 4 and 4 exceptions.
func TestOpenChunkReadAgainDescribesTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL, amount smallint)`)
	require.NoError(t, err)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	src := &opsSource{}
	for i := int64(0); i < 20; i++ {
		src.set(i, today.Add(time.Minute), i)
	}
	src.set(50, today.Add(time.Minute), int64(1)<<40) // beyond smallint: queued
	job := opsJob(src, 1)
	job.Rollback, job.MaxRunRejectRate = backfill.RollbackNone, -1
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	var rep backfill.Report
	for i := 0; i < 4; i++ {
		if i == 3 {
			src.set(7, today.Add(time.Minute), 700) // one row changes before the last read
		}
		rep, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrChunksOpen)
		if !time.Now().UTC().Truncate(24 * time.Hour).Equal(today) {
			t.Skip("the test ran across midnight UTC")
		}
	}
	var queued int
	require.NoError(t, db.Get(&queued, `SELECT count(*) FROM backfill.exceptions WHERE batch_id = $1 AND failed_attempt IS NULL`, rep.BatchID))
	require.Equal(t, 1, queued, "one bad row, one exception")
	require.Equal(t, backfill.Counts{Read: 21, Inserted: 20, Rejected: 1}, rep.Counts,
		"the chunk as it stands: 21 rows, the 20 the first read inserted (one changed since) inserted, one rejected")
	require.True(t, rep.Counts.Balanced())
}

// TestCountsRereadBalances: Counts.Reread of balanced counts balances,
// is never negative, and takes Read, Rejected and Deduplicated from the
// latest read.
func TestCountsRereadBalances(t *testing.T) {
	t.Parallel()
	gen := func(i int64) backfill.Counts {
		c := backfill.Counts{Inserted: i % 5, Updated: i / 5 % 3, Unchanged: i / 15 % 4, Rejected: i / 60 % 2, Deduplicated: i / 120 % 2}
		c.Read = c.Inserted + c.Updated + c.Unchanged + c.Rejected + c.Deduplicated
		return c
	}
	for i := int64(0); i < 240; i += 7 {
		for j := int64(0); j < 240; j += 5 {
			prev, cur := gen(i), gen(j)
			got := prev.Reread(cur)
			require.True(t, got.Balanced(), "%+v reread %+v = %+v", prev, cur, got)
			require.GreaterOrEqual(t, min(got.Inserted, got.Updated, got.Unchanged), int64(0))
			require.Equal(t, [3]int64{cur.Read, cur.Rejected, cur.Deduplicated}, [3]int64{got.Read, got.Rejected, got.Deduplicated})
			require.GreaterOrEqual(t, got.Inserted, min(prev.Inserted, cur.Read-cur.Rejected-cur.Deduplicated))
		}
	}
}

// TestRollbackRunWithOnlyOpenChunks: a batch whose only unfinished chunk
// is open can be rolled back (it is paused first); the row it updated in
// two reads gets its image from before the batch back. On the starting
// commit Rollback refused: "the run is still running".
func TestRollbackRunWithOnlyOpenChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL, amount bigint,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	_, err = db.Exec(`INSERT INTO ev VALUES (5, $1, 0, NULL, NULL)`, today.Add(time.Hour))
	require.NoError(t, err)
	src := &opsSource{}
	src.set(5, today.Add(time.Hour), 1)
	src.set(6, today.Add(time.Hour), 1)
	job := opsJob(src, 1)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	src.set(5, today.Add(time.Hour), 2)
	src.set(6, today.Add(time.Hour), 2)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	require.Equal(t, 1, rep.ChunksOpen)

	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ops", Why: "test", ChunkID: rep.OpenChunks[0]})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig, "one chunk of a running run: refused, naming what to do")
	require.Contains(t, err.Error(), "roll back the whole batch")
	pre, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Preview: true})
	require.NoError(t, err)
	require.Equal(t, backfill.RunRunning, pre.Status, "a preview changes nothing")
	rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ops", Why: "test"})
	require.NoError(t, err, "an operator can withdraw a batch whose only unfinished chunk is open")
	require.Equal(t, backfill.RunRolledBack, rb.Status)
	var got []struct {
		ID     int64 `db:"id"`
		Amount int64 `db:"amount"`
	}
	require.NoError(t, db.Select(&got, `SELECT id, amount FROM ev ORDER BY id`))
	require.Equal(t, 1, len(got), "row 6, inserted by the batch, is gone: %+v", got)
	require.Equal(t, int64(0), got[0].Amount, "row 5 has its image from before the batch: %+v", got)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAlreadyCompleted, "a rolled back run is not read again")

	// A running run with a pending chunk is refused, saying what to do.
	job.Name, job.NewRun = "ev-pending", true
	job.Chunker = backfill.IntRange(0, 2, 1)
	job.ChunkColumn = ""
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 1 {
			return context.Canceled
		}
		return w.Write(ctx, 10, today, 1)
	})
	rep, err = r.Run(ctx, job)
	require.Error(t, err)
	_, err = db.Exec(`UPDATE backfill.runs SET status = 'running' WHERE batch_id = $1`, rep.BatchID)
	require.NoError(t, err)
	_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: "ops", Why: "test"})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.Contains(t, err.Error(), "run the job again")
}

// negatives is a gate failing a chunk whose staging holds negative
// amounts, with their count as its actual value.
var negatives = backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
	var n int
	if err := sqlx.GetContext(ctx, tx, &n, `SELECT count(*) FROM `+sc.Staging+` WHERE amount < 0`); err != nil {
		return backfill.CheckResult{}, err
	}
	return backfill.CheckResult{Check: "no_negative", Severity: backfill.SeverityError, Passed: n == 0, Expected: "0", Actual: fmt.Sprint(n)}, nil
})

// TestAcceptGateBindsTheEvidence: accepting "1 negative" on an open chunk
// does not accept a later read with 6; accepting a chunk judged again
// since (completed with an acceptance) while another chunk paused the run
// is refused with ErrNoFailedGate. On the starting commit both were
// accepted by check name.
func TestAcceptGateBindsTheEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("open chunk read again", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		_, err := db.Exec(`CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL, amount bigint)`)
		require.NoError(t, err)
		today := time.Now().UTC().Truncate(24 * time.Hour)
		src := &opsSource{}
		for i := int64(0); i < 10; i++ {
			src.set(i, today.Add(time.Minute), i)
		}
		job := opsJob(src, 2)
		job.Rollback, job.Validators = backfill.RollbackNone, []backfill.Validator{negatives}
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
		require.NoError(t, err)
		for i := 0; i < 2; i++ {
			rep, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrChunksOpen)
			require.Equal(t, 2, rep.ChecksPassed, "one verdict per chunk and check")
		}
		src.set(50, today.Add(time.Minute), -1)
		rep, err := r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrGateFailed)
		open := rep.OpenChunks[0]
		rep, err = r.AcceptGate(ctx, job, open, "ops", "one known negative")
		require.ErrorIs(t, err, backfill.ErrChunksOpen)
		require.Equal(t, 1, rep.ChecksAccepted)
		_, err = r.AcceptGate(ctx, job, open, "ops", "again")
		require.ErrorIs(t, err, backfill.ErrNotPaused)
		rep, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrChunksOpen, "the same evidence stays accepted on the next read")
		require.NotErrorIs(t, err, backfill.ErrGateFailed)
		for i := int64(60); i < 65; i++ {
			src.set(i, today.Add(time.Minute), -1)
		}
		rep, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrGateFailed, "6 negatives were never accepted; 1 was")
		require.Equal(t, backfill.RunPaused, rep.Status)
		if !time.Now().UTC().Truncate(24 * time.Hour).Equal(today) {
			t.Skip("the test ran across midnight UTC")
		}
	})
	t.Run("chunk judged again since", func(t *testing.T) {
		t.Parallel()
		s := newItems(t)
		fails := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
			ok := sc.Chunk.Lo != 200 && sc.Chunk.Lo != 700
			return backfill.CheckResult{Check: "fails", Severity: backfill.SeverityError, Passed: ok, Expected: "ok", Actual: fmt.Sprint(ok)}, nil
		})
		job := s.job(1)
		job.Validators = []backfill.Validator{fails}
		r, err := backfill.New(s.db, nil)
		require.NoError(t, err)
		_, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrGateFailed)
		_, err = r.AcceptGate(ctx, job, "int:300/400", "ann", "never failed")
		require.ErrorIs(t, err, backfill.ErrNoFailedGate)
		rep, err := r.AcceptGate(ctx, job, "int:200/300", "ann", "known")
		require.ErrorIs(t, err, backfill.ErrGateFailed, "700 fails next")
		require.Equal(t, backfill.RunPaused, rep.Status)
		_, err = r.AcceptGate(ctx, job, "int:200/300", "bob", "wrong chunk")
		require.ErrorIs(t, err, backfill.ErrNoFailedGate, "200 is done; 700 paused the run")
		require.ErrorIs(t, err, backfill.ErrInvalidConfig)
		require.Contains(t, err.Error(), "int:700/800")
		rep, err = r.AcceptGate(ctx, job, "int:700/800", "bob", "known too")
		require.NoError(t, err)
		require.Equal(t, backfill.RunCompleted, rep.Status)
	})
}

// TestValidatorSwapIsAudited: swapping a ValidatorFunc for another (same
// Go type), or a struct validator for one differing only in unexported
// fields, is a validators_changed event. On the starting commit both
// were recorded by Go type alone and looked the same.
func TestValidatorSwapIsAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := badChunkJob(s)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		return backfill.CheckResult{Check: "no_bad_names", Severity: backfill.SeverityError, Passed: true}, nil
	})}
	rep, err = r.Resume(ctx, job, "mallory", "flaky")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	events, err := backfill.NewPGManifest("").Events(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var changes []string
	for _, e := range events {
		if e.Kind == backfilltype.EventValidatorsChanged {
			changes = append(changes, string(e.Detail))
		}
	}
	require.Len(t, changes, 1, "the gate was replaced by one that always passes")
	require.Contains(t, changes[0], "TestValidatorSwapIsAudited")

	// Unexported configuration: the description differs.
	a := []backfill.Validator{hiddenLimit{limit: 1}}
	b := []backfill.Validator{hiddenLimit{limit: 2}}
	require.NotEqual(t, describeValidators(t, ctx, a), describeValidators(t, ctx, b))
}

// hiddenLimit is a validator whose configuration is unexported.
type hiddenLimit struct{ limit int }

func (h hiddenLimit) Validate(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
	return backfill.CheckResult{Check: "hidden", Severity: backfill.SeverityWarn, Passed: h.limit > 0}, nil
}

// describeValidators runs a one-row job with vs and returns the
// validators recorded in its validators_set event.
func describeValidators(t *testing.T, ctx context.Context, vs []backfill.Validator) string {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE t (id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	job := backfill.Job{Name: "t", Chunker: backfill.IntRange(0, 1, 1), Rollback: backfill.RollbackNone, Validators: vs,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error { return w.Write(ctx, c.Lo) }),
		Target:    backfill.Target{Table: "t", Key: []string{"id"}}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	events, err := backfill.NewPGManifest("").Events(ctx, db, rep.BatchID)
	require.NoError(t, err)
	for _, e := range events {
		if e.Kind == backfilltype.EventValidatorsSet {
			var d struct{ Validators []string }
			require.NoError(t, json.Unmarshal(e.Detail, &d))
			return fmt.Sprint(d.Validators)
		}
	}
	t.Fatal("no validators_set event")
	return ""
}

// TestRunWithOpenChunksIsNotSuccess: a call that ends with open chunks
// returns ErrChunksOpen (and the report says which), and a run whose
// chunks, open ones included, loaded none of the rows they read pauses.
// On the starting commit both calls returned a nil error.
func TestRunWithOpenChunksIsNotSuccess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE ev (id bigint PRIMARY KEY, at timestamptz NOT NULL, amount smallint)`)
	require.NoError(t, err)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	src := &opsSource{}
	src.set(1, today.Add(-time.Hour), 1)
	src.set(2, today.Add(time.Minute), 1)
	job := opsJob(src, 2)
	job.Rollback = backfill.RollbackNone
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrChunksOpen)
	require.Equal(t, backfill.RunRunning, rep.Status)
	require.Equal(t, 1, rep.ChunksOpen)
	require.Contains(t, err.Error(), rep.OpenChunks[0])

	src2 := &opsSource{}
	src2.set(1, today.Add(-time.Hour), int64(1)<<40) // every row beyond smallint
	src2.set(2, today.Add(time.Minute), int64(1)<<40)
	job2 := opsJob(src2, 2)
	job2.Name, job2.Rollback, job2.MaxRunRejectRate = "ev-none", backfill.RollbackNone, -1
	rep, err = r.Run(ctx, job2)
	require.ErrorIs(t, err, backfill.ErrGateFailed, "none of 2 rows loaded: the run pauses although a chunk is open")
	require.Contains(t, err.Error(), "no row loaded")
	require.Equal(t, backfill.RunPaused, rep.Status)
	rep, err = r.Resume(ctx, job2, "ops", "known empty")
	require.ErrorIs(t, err, backfill.ErrChunksOpen, "resumed past the pause; the open chunk read again does not pause it again")
	require.NotErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunRunning, rep.Status)
}

// TestRunRejectGateResumedOnce: one chunk rejects 5 of its 10 rows and
// pauses the run; one Resume lets the three clean chunks after it
// complete the run, and the gate's error lists the chunk as done, not as
// failed. On the starting commit the gate re-counted the same 5 rejects
// after every later chunk and paused after each Resume.
func TestRunRejectGateResumedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 40, 10)
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
		for id := ch.Lo; id < ch.Hi; id++ {
			if ch.Lo == 0 && id < 5 {
				if err := w.Reject(ctx, id, "id", "bad source row"); err != nil {
					return err
				}
				continue
			}
			if err := w.Write(ctx, "acme", id, "x", "1.00", nil); err != nil {
				return err
			}
		}
		return nil
	})
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	var pe *backfill.PartialError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, []string{"int:0/10"}, pe.Done)
	require.Nil(t, pe.Failed, "the chunk is done; the run gate is not its failure")
	require.Contains(t, err.Error(), "1 chunks done in this call, 0 failed")
	rep, err := r.Resume(ctx, job, "ann", "the 5 rows are known bad")
	require.NoError(t, err, "one Resume gets the run past the rejects the operator saw")
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 40, Inserted: 35, Rejected: 5}, rep.Counts)
}
