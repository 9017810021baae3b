package backfill_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestQualityGatePausesAndResumes: an error-level check that fails stops
// publishing at that chunk; no later chunk is visible; resuming needs who
// and why, and completes once the data is fixed.
func TestQualityGatePausesAndResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var broken atomic.Bool
	broken.Store(true)
	noBadNames := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		var n int
		if err := sqlx.GetContext(ctx, tx, &n, `SELECT count(*) FROM `+sc.Staging+` WHERE name = 'bad'`); err != nil {
			return backfill.CheckResult{}, err
		}
		return backfill.CheckResult{Check: "no_bad_names", Severity: backfill.SeverityError, Passed: n == 0,
			Expected: "0 bad names", Actual: fmt.Sprintf("%d bad names", n)}, nil
	})
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 400 && broken.Load() {
			if err := w.Write(ctx, "acme", int64(400), "bad", "1.00", nil); err != nil {
				return err
			}
			c.Lo = 401
		}
		return inner.Extract(ctx, c, w)
	})
	job.Validators = []backfill.Validator{noBadNames}
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, 4, rep.ChunksDone)
	var max int64
	require.NoError(t, s.db.Get(&max, `SELECT max(id) FROM items`))
	require.Equal(t, int64(399), max, "nothing of the failing chunk or later is visible")

	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrRunPaused, "a paused run does not resume by itself")
	_, err = r.Resume(ctx, job, "", "")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	broken.Store(false)
	rep, err = r.Resume(ctx, job, "ann", "source fixed in ticket 42")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, int64(1000), rep.Counts.Inserted)

	require.Equal(t, 10, rep.ChecksPassed, "one verdict per chunk and check: the latest")
	require.Zero(t, rep.ChecksFailed)
	require.Empty(t, rep.FailedChecks)
	require.Equal(t, []string{"int:400/500: no_bad_names: expected 0 bad names, got 1 bad names (attempt 1, rolled back)"}, rep.SupersededChecks)
	vs, err := backfill.NewPGManifest("").Validations(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, vs, 11, "10 passing chunks and the failed attempt: evidence is appended, never overwritten")
	failed := 0
	for _, v := range vs {
		if !v.Passed {
			failed++
			require.Equal(t, "int:400/500", v.ChunkID)
			require.Equal(t, "1 bad names", v.Actual)
		}
	}
	require.Equal(t, 1, failed)
	events, err := backfill.NewPGManifest("").Events(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var resumedBy string
	for _, e := range events {
		if e.Kind == "run_resumed_by_operator" {
			resumedBy = e.Actor + ": " + string(e.Detail)
		}
	}
	require.Equal(t, `ann: {"why": "source fixed in ticket 42", "read": 400, "rejected": 0}`, resumedBy, "the resume records the rows it accepts")
}

// TestReportsCanExcludeIncompleteBatches: rows of a batch that has not
// completed are hidden by joining the lineage to backfill.completed_batches.
func TestReportsCanExcludeIncompleteBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	_, err = r.Run(ctx, s.job(1))
	require.NoError(t, err)
	job := s.job(2)
	job.NewRun = true
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo == 500 {
			return fmt.Errorf("source down")
		}
		return inner.Extract(ctx, c, w)
	})
	_, err = r.Run(ctx, job) // batch 2 stops half way
	require.Error(t, err)
	const visible = `SELECT count(*) FROM items i WHERE i.backfill_updated_by IS NULL
		OR EXISTS (SELECT 1 FROM backfill.completed_batches b WHERE b.batch_id = i.backfill_updated_by)`
	var n, changed int
	require.NoError(t, s.db.Get(&n, visible))
	require.NoError(t, s.db.Get(&changed, `SELECT count(*) FROM items WHERE backfill_updated_by = 2`))
	require.Equal(t, 50, changed, "batch 2 changed every tenth row of its 5 done chunks")
	require.Equal(t, 1000-changed, n, "reports do not see the rows of the incomplete batch 2")
}

func TestRunRejectRateGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo >= 300 {
			// From the fourth chunk on, a third of the rows are bad.
			for id := c.Lo; id < c.Hi; id++ {
				if id%3 == 0 {
					if err := w.Reject(ctx, map[string]any{"id": id}, "", "bad row"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, "acme", id, "x", "1.00", nil); err != nil {
					return err
				}
			}
			return nil
		}
		return inner.Extract(ctx, c, w)
	})
	job.MaxRunRejectRate = 0.05
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Contains(t, err.Error(), "run reject rate")
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, 4, rep.ChunksDone, "34/400 = 8.5% after the fourth chunk pauses the run")
}

// noBadNames is a gate that fails a chunk whose staging holds names
// 'bad', with their keys as the sample.
var noBadNames = backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
	var keys []string
	if err := sqlx.SelectContext(ctx, tx, &keys, `SELECT format('(%s, %s)', tenant, id) FROM `+sc.Staging+` WHERE name = 'bad' ORDER BY id`); err != nil {
		return backfill.CheckResult{}, err
	}
	return backfill.CheckResult{Check: "no_bad_names", Severity: backfill.SeverityError, Passed: len(keys) == 0,
		Expected: "0 bad names", Actual: fmt.Sprintf("%d bad names", len(keys)), Sample: keys}, nil
})

// badChunkJob is the items job whose chunk [400, 500) holds two rows the
// extractor rejects and two rows named 'bad'.
func badChunkJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Lo != 400 {
			return inner.Extract(ctx, c, w)
		}
		for id := c.Lo; id < c.Hi; id++ {
			var err error
			switch id {
			case 410, 420:
				err = w.Reject(ctx, map[string]any{"id": id}, "amount", "unparsable amount")
			case 430, 440:
				err = w.Write(ctx, "acme", id, "bad", "1.00", nil)
			default:
				err = w.Write(ctx, "acme", id, fmt.Sprintf("item-%d", id), "1.00", nil)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	job.Validators = []backfill.Validator{noBadNames}
	return job
}

// TestGateEvidenceSurvivesRollback: a failed gate rolls its chunk back,
// yet the failed result with its sample of keys and the rows the attempt
// rejected are kept, marked as a failed attempt and apart from the
// exception queue. An operator accepts the gate for that chunk, with who
// and why; the chunk then completes, the failed evidence stays, the
// acceptance is visible, and each chunk's check counts once.
func TestGateEvidenceSurvivesRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	m := backfill.NewPGManifest("")
	job := badChunkJob(s)
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 3, ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)

	vs, err := m.Validations(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var failed []backfilltype.Validation
	for _, v := range vs {
		if !v.Passed {
			failed = append(failed, v)
		}
	}
	require.Len(t, failed, 1)
	require.Equal(t, "int:400/500", failed[0].ChunkID)
	require.Equal(t, 1, failed[0].FailedAttempt)
	require.Equal(t, []string{"(acme, 430)", "(acme, 440)"}, failed[0].Sample, "which rows were bad, not only how many")
	fx, err := m.FailedAttemptExceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, fx, 2, "the rows the rolled back attempt rejected")
	for i, id := range []int64{410, 420} {
		require.Equal(t, "int:400/500", fx[i].ChunkID)
		require.Equal(t, 1, fx[i].FailedAttempt)
		require.Equal(t, "unparsable amount", fx[i].Reason)
		require.JSONEq(t, fmt.Sprintf(`{"id": %d}`, id), string(fx[i].Raw))
	}
	queue, err := m.Exceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Empty(t, queue, "evidence of a rolled back attempt is not in the exception queue")

	_, err = r.AcceptGate(ctx, job, "int:300/400", "ann", "wrong chunk")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig, "a chunk without a failed gate")
	_, err = r.AcceptGate(ctx, job, "int:400/500", "", "")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig, "who and why are required")

	rep, err = r.AcceptGate(ctx, job, "int:400/500", "ann", "two known bad names, ticket 7")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 10, rep.ChunksDone)
	require.Equal(t, 10, rep.ChecksPassed+rep.ChecksFailed, "one verdict per chunk")
	require.Equal(t, 1, rep.ChecksAccepted)
	require.Equal(t, []string{"int:400/500: no_bad_names: expected 0 bad names, got 2 bad names (accepted)"}, rep.FailedChecks)
	require.Len(t, rep.SupersededChecks, 1)
	var bad int
	require.NoError(t, s.db.Get(&bad, `SELECT count(*) FROM items WHERE name = 'bad'`))
	require.Equal(t, 2, bad, "the accepted chunk completed")

	vs, err = m.Validations(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var attempts []string
	for _, v := range vs {
		if v.ChunkID == "int:400/500" {
			attempts = append(attempts, fmt.Sprintf("attempt %d passed=%t accepted=%t", v.FailedAttempt, v.Passed, v.Accepted))
		}
	}
	require.Equal(t, []string{"attempt 1 passed=false accepted=false", "attempt 0 passed=false accepted=true"}, attempts,
		"the failed evidence is kept beside the accepted result")
	fx, err = m.FailedAttemptExceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, fx, 2)
	queue, err = m.Exceptions(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, queue, 2, "the completed attempt queued its rejects")
	require.Equal(t, int64(2), rep.Counts.Rejected)

	events, err := m.Events(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var accepted []string
	for _, e := range events {
		if e.Kind == backfilltype.EventGateAccepted {
			var d map[string]any
			require.NoError(t, json.Unmarshal(e.Detail, &d))
			accepted = append(accepted, fmt.Sprintf("%s: %v %v %v", e.Actor, d["chunk"], d["checks"], d["why"]))
		}
	}
	require.Equal(t, []string{"ann: int:400/500 [no_bad_names] two known bad names, ticket 7"}, accepted)
}

// TestGateJudgedTwiceCountsOnce: at Concurrency 4, chunks whose gate
// fails on their first judgment and passes after a resume count once
// each in the report's validation summary.
func TestGateJudgedTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	var mu sync.Mutex
	judged := map[string]int{}
	flaky := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		mu.Lock()
		judged[sc.Chunk.ID]++
		n := judged[sc.Chunk.ID]
		mu.Unlock()
		ok := n > 1 || (sc.Chunk.Lo != 200 && sc.Chunk.Lo != 700)
		return backfill.CheckResult{Check: "flaky", Severity: backfill.SeverityError, Passed: ok, Expected: "ok", Actual: fmt.Sprint(ok)}, nil
	})
	job := s.job(1)
	job.Validators = []backfill.Validator{flaky}
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 4, ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	for i := 0; rep.Status == backfill.RunPaused && i < 3; i++ {
		rep, err = r.Resume(ctx, job, "ann", "flaky check")
		if rep.Status != backfill.RunPaused {
			require.NoError(t, err)
		}
	}
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 10, rep.ChecksPassed)
	require.Zero(t, rep.ChecksFailed, "a failure superseded by a later judgment does not count")
	require.Empty(t, rep.FailedChecks)
	require.Len(t, rep.SupersededChecks, 2)
}

// TestValidatorChangesAreAudited: validators are not part of the plan, so
// changing them between calls does not refuse a resume, but every change
// is an audit event (and a warning).
func TestValidatorChangesAreAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	m := backfill.NewPGManifest("")
	job := badChunkJob(s)
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)

	// The operator drops the failing gate and adds another check.
	job.Validators = []backfill.Validator{backfill.DuplicateKeys{}}
	rep, err = r.Resume(ctx, job, "ann", "drop the name check")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Len(t, rep.Warnings, 1)
	require.Contains(t, rep.Warnings[0], "validators changed")
	events, err := m.Events(ctx, s.db, rep.BatchID)
	require.NoError(t, err)
	var kinds []string
	var change map[string][]string
	for _, e := range events {
		switch e.Kind {
		case backfilltype.EventValidatorsSet, backfilltype.EventValidatorsChanged:
			kinds = append(kinds, e.Kind)
		}
		if e.Kind == backfilltype.EventValidatorsChanged {
			require.NoError(t, json.Unmarshal(e.Detail, &change))
		}
	}
	require.Equal(t, []string{backfilltype.EventValidatorsSet, backfilltype.EventValidatorsChanged}, kinds)
	require.Len(t, change["removed"], 1)
	require.Contains(t, change["removed"][0], "backfill.ValidatorFunc github.com/pgbackfill/backfill_test.", "a function is named by its symbol")
	require.Len(t, change["added"], 1)
	require.Contains(t, change["added"][0], "backfill.DuplicateKeys")
}

func init() {
	// The child process of TestKillDashNineWhileRecordingGateEvidence:
	// run the bad-chunk job until its gate fails.
	childProcess("BACKFILL_GATE_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, &backfill.Config{HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second})
		if err != nil {
			return err
		}
		_, err = r.Run(context.Background(), badChunkJob(&itemsSetup{db: db}))
		if errors.Is(err, backfill.ErrGateFailed) {
			return nil
		}
		return err
	})
}

// TestKillDashNineWhileRecordingGateEvidence kills the process with
// SIGKILL in the middle of recording a failed gate's evidence (its
// results written, its rejected rows not yet): none of it is kept, the
// run is still running and the chunk pending, and the next call judges
// the chunk again and records the evidence once, with the pause.
func TestKillDashNineWhileRecordingGateEvidence(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("spawns processes")
	}
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { db.Close() })
	createItems(t, db)
	m := backfill.NewPGManifest("")
	require.NoError(t, m.Init(ctx, db))

	// Hold the exception table: the child's evidence transaction writes
	// the failed results, then waits here to write the rejected rows.
	lock, err := db.Beginx()
	require.NoError(t, err)
	defer lock.Rollback()
	_, err = lock.Exec(`LOCK TABLE backfill.exceptions IN SHARE MODE`)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BACKFILL_GATE_CHILD="+url)
	require.NoError(t, cmd.Start())
	app := childAppName(cmd.Process.Pid)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var waiting int
		require.NoError(t, db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity
			WHERE (application_name = $1 OR application_name LIKE 'backfill % ' || $1) AND wait_event_type = 'Lock' AND query LIKE '%exceptions%'`, app))
		if waiting > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the child never reached the evidence")
		time.Sleep(2 * time.Millisecond)
	}
	var results int
	require.NoError(t, db.Get(&results, `SELECT count(*) FROM backfill.validations WHERE NOT passed`))
	require.Zero(t, results, "uncommitted")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	require.NoError(t, lock.Rollback())
	deadline = time.Now().Add(30 * time.Second)
	for {
		var left int
		require.NoError(t, db.Get(&left, `SELECT count(*) FROM pg_stat_activity WHERE (application_name = $1 OR application_name LIKE 'backfill % ' || $1)`, app))
		if left == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the child's server processes did not end")
		time.Sleep(2 * time.Millisecond)
	}

	run, err := m.LatestRun(ctx, db, "items")
	require.NoError(t, err)
	require.Equal(t, backfill.RunRunning, run.Status, "the pause died with the evidence")
	vs, err := m.Validations(ctx, db, run.BatchID)
	require.NoError(t, err)
	for _, v := range vs {
		require.True(t, v.Passed, "no partial evidence: %+v", v)
	}
	fx, err := m.FailedAttemptExceptions(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Empty(t, fx)
	cs := manifestChunks(t, db, run.BatchID)
	// The killed worker's lease (short transactions: it extracted
	// outside a transaction) is taken over once it is stale.
	deadline = time.Now().Add(30 * time.Second)
	for {
		var live int
		require.NoError(t, db.Get(&live, `SELECT count(*) FROM backfill.chunks c WHERE c.lease_key IS NOT NULL
			AND (c.leased_at >= now() - interval '1 second' OR EXISTS (SELECT 1 FROM backfill.workers w WHERE w.worker_key = c.lease_key
				AND w.finished_at IS NULL AND w.heartbeat_at >= now() - w.stale_after))`))
		if live == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the killed worker's lease never went stale")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, backfill.ChunkPending, cs[4].Status)

	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second})
	require.NoError(t, err)
	rep, err := r.Run(ctx, badChunkJob(&itemsSetup{db: db}))
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, run.BatchID, rep.BatchID)
	vs, err = m.Validations(ctx, db, run.BatchID)
	require.NoError(t, err)
	failed := 0
	for _, v := range vs {
		if !v.Passed {
			failed++
			require.Equal(t, []string{"(acme, 430)", "(acme, 440)"}, v.Sample)
		}
	}
	require.Equal(t, 1, failed, "the evidence is recorded once")
	fx, err = m.FailedAttemptExceptions(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Len(t, fx, 2)
	require.Equal(t, 4, rep.ChunksDone, "chunks 0-3 done; the killed attempt left chunk 4 to judge again")
}

// TestGateEvidenceSurvivesPublishAtEnd: a gate that fails while a run
// published at its end merges keeps its evidence too, outside the
// publish it rolled back.
func TestGateEvidenceSurvivesPublishAtEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL,
		backfill_inserted_by bigint, backfill_updated_by bigint)`)
	require.NoError(t, err)
	job := atEndJob(false)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		ok := sc.Chunk.Lo != 100
		var sample []string
		if !ok {
			sample = []string{"(100)"}
		}
		return backfill.CheckResult{Check: "no_chunk_100", Severity: backfill.SeverityError, Passed: ok, Expected: "not 100", Actual: fmt.Sprint(sc.Chunk.Lo), Sample: sample}, nil
	})}
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	vs, err := backfill.NewPGManifest("").Validations(ctx, db, rep.BatchID)
	require.NoError(t, err)
	var failed []string
	for _, v := range vs {
		if !v.Passed {
			failed = append(failed, fmt.Sprintf("%s %s %v attempt %d", v.ChunkID, v.Check, v.Sample, v.FailedAttempt))
		}
	}
	require.Equal(t, []string{"int:100/120 no_chunk_100 [(100)] attempt 1"}, failed)
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM orders`))
	require.Zero(t, n, "nothing published")
}

// The run reject-rate gate at the end of a call (finalGate): a chunk
// without rejects reads no totals once its call has, so a run must not
// complete before one more check of the batch's totals.

// TestRunGateWhenTheRejectingWorkerDies: worker A commits a chunk whose
// rejects push the run over MaxRunRejectRate and dies (here: hangs)
// before its own rate check. Worker B, which already checked the rate
// once, runs the remaining clean chunks: its call checks the batch's
// totals once more before the run can complete (finalGate), and pauses
// the run on the gate instead of completing it.
func TestRunGateWhenTheRejectingWorkerDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	_, err := db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	aHolds, aGo, aCommitted, hang := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(hang) })
	job := func(hold func(c backfill.Chunk)) backfill.Job {
		return backfill.Job{Name: "live", Chunker: backfill.IntRange(0, 60, 10), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "live", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				hold(c)
				for id := c.Lo; id < c.Hi; id++ {
					if c.Seq == 0 {
						if err := w.Reject(ctx, map[string]any{"id": id}, "v", "bad"); err != nil {
							return err
						}
						continue
					}
					if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
						return err
					}
				}
				return nil
			})}
	}
	// A extracts serially: a worker hung with its heartbeat going on, as
	// here, would otherwise keep the lease of the chunk it extracted
	// ahead, which a dead one gives up after StaleAfter.
	runner := func(id string, hooks backfill.Hooks) *backfill.Runner {
		r, err := backfill.New(db, &backfill.Config{WorkerID: id, ReturnOnPause: true, HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second,
			RetryBackoff: 10 * time.Millisecond, MaxRejectsPerChunk: -1, Hooks: hooks, SerialExtract: id == "worker-a"})
		require.NoError(t, err)
		return r
	}
	a := runner("worker-a", backfill.HooksFunc(func(ctx context.Context, _ int64, r backfill.ChunkResult) {
		if r.Chunk.Seq == 0 {
			close(aCommitted)
			<-hang // the process "dies" between the commit and the rate check
		}
	}))
	go func() {
		_, _ = a.Run(ctx, job(func(c backfill.Chunk) {
			if c.Seq == 0 {
				close(aHolds)
				<-aGo
			}
		}))
	}()
	<-aHolds
	b := runner("worker-b", nil)
	bDone := make(chan error, 1)
	var rep backfill.Report
	go func() {
		var err error
		rep, err = b.Run(ctx, job(func(c backfill.Chunk) {
			if c.Seq == 2 { // B has done chunk 1 (and checked the rate once)
				close(aGo)
				<-aCommitted
			}
		}))
		bDone <- err
	}()
	err = <-bDone
	var rejected, read int64
	require.NoError(t, db.QueryRow(`SELECT sum(rows_rejected), sum(rows_read) FROM backfill.chunks`).Scan(&rejected, &read))
	t.Logf("B: status %s err %v; run totals: %d rejected of %d read", rep.Status, err, rejected, read)
	require.NotEqual(t, backfill.RunCompleted, rep.Status, "run completed with reject rate %d/%d above the 10%% default", rejected, read)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	var status string
	require.NoError(t, db.Get(&status, `SELECT status FROM backfill.runs`))
	require.Equal(t, "paused", status)
}

func gateCrashJob() backfill.Job {
	return backfill.Job{Name: "crashrate", Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "crashrate", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if c.Seq == 2 { // the last chunk rejects every row: 10/30 > 10%
					if err := w.Reject(ctx, map[string]any{"id": id}, "v", "bad"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			return nil
		})}
}

// TestRunGateAfterACrashAfterTheLastChunk: the process dies between the
// last chunk's commit and its rate check; the resumed call finds no chunk
// to run, checks the batch's totals (finalGate) and pauses the run on the
// gate instead of completing it above MaxRunRejectRate.
func TestRunGateAfterACrashAfterTheLastChunk(t *testing.T) {
	if url := os.Getenv("BACKFILL_GATE_CRASH_CHILD"); url != "" {
		db := sqlx.MustOpen("postgres", url)
		r, err := backfill.New(db, &backfill.Config{Concurrency: 1, MaxRejectsPerChunk: -1,
			Hooks: backfill.HooksFunc(func(ctx context.Context, _ int64, res backfill.ChunkResult) {
				if res.Chunk.Seq == 2 {
					os.Exit(7) // kill -9 between the commit and the check
				}
			})})
		require.NoError(t, err)
		_, _ = r.Run(context.Background(), gateCrashJob())
		t.Fatal("child not killed")
	}
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	db.MustExec(`CREATE TABLE crashrate (id bigint PRIMARY KEY, v text NOT NULL)`)
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunGateAfterACrashAfterTheLastChunk$")
	cmd.Env = append(os.Environ(), "BACKFILL_GATE_CRASH_CHILD="+url)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, string(out))
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true, Concurrency: 1, MaxRejectsPerChunk: -1})
	require.NoError(t, err)
	rep, err := r.Run(ctx, gateCrashJob())
	t.Logf("resumed: status %s resumed %v err %v", rep.Status, rep.Resumed, err)
	require.NotEqual(t, backfill.RunCompleted, rep.Status, "completed at a run reject rate of 10/30")
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
}

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
// is refused with ErrNoFailedGate.
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
		r, err := backfill.New(db, &backfill.Config{Concurrency: 2, ReturnOnPause: true})
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
		r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
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
// fields, is a validators_changed event.
func TestValidatorSwapIsAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := badChunkJob(s)
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
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
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
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
// failed.
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
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	var pe *backfill.PartialError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, []string{"int:0/10"}, pe.Done)
	require.Nil(t, pe.Failed, "the chunk is done; the run gate is not its failure")
	require.Contains(t, err.Error(), "stopped with no chunk failed, 1 chunks done in this call")
	rep, err := r.Resume(ctx, job, "ann", "the 5 rows are known bad")
	require.NoError(t, err, "one Resume gets the run past the rejects the operator saw")
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, backfill.Counts{Read: 40, Inserted: 35, Rejected: 5}, rep.Counts)
}
