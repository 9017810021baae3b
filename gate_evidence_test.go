package backfill_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

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
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 3})
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
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 4})
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
	r, err := backfill.New(s.db, nil)
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

	r, err := backfill.New(db, &backfill.Config{HeartbeatInterval: 100 * time.Millisecond, StaleAfter: time.Second})
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
	r, err := backfill.New(db, nil)
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
