package backfill_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/stretchr/testify/require"
)

// TestAuditReplay: every decision about a run is an event of the
// append-only audit log with its actor and database role: the start
// (awaiting approval, with the fingerprint), the approvals, pauses,
// resumes, knobs, the run's end, a named preview of the rollback and the
// rollback. Replaying the log gives the control state the manifest holds:
// status, knobs and approvals, at each step.
func TestAuditReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	m := backfill.NewPGManifest("")
	job := s.job(1)
	job.Approval = backfill.ApprovalPolicy{Approvers: 2}
	author, err := backfill.New(s.db, &backfill.Config{WorkerID: "author", ReturnOnPause: true})
	require.NoError(t, err)
	aliceRole, aliceDB := s.operator(t, "alice")
	bobRole, bobDB := s.operator(t, "bob")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	bob, err := backfill.New(bobDB, nil)
	require.NoError(t, err)

	rep, err := author.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	batch := rep.BatchID
	// equal replays the log and compares it with the manifest's state.
	equal := func(step string) backfilltype.ReplayedControl {
		t.Helper()
		events, err := m.Events(ctx, s.db, batch)
		require.NoError(t, err)
		got := backfilltype.ReplayControl(events)
		st, err := m.Control(ctx, s.db, batch)
		require.NoError(t, err)
		ap, err := m.Approvals(ctx, s.db, batch)
		require.NoError(t, err)
		want := backfilltype.ReplayedControl{Status: st.Status, Knobs: st.Knobs, Approvals: []string{}}
		for _, a := range ap.Approvals {
			want.Approvals = append(want.Approvals, a.Approver+"@"+a.DBRole)
		}
		require.Equal(t, want, got, step)
		return got
	}
	require.Equal(t, backfill.RunAwaitingApproval, equal("started").Status)

	require.NoError(t, alice.Approve(ctx, batch, mustFingerprint(t, s, batch), "alice", "scope checked"))
	equal("one approval")
	require.ErrorIs(t, alice.SetKnob(ctx, batch, "concurrency", "1", "alice", "before approval"), backfill.ErrRunStatus)
	require.NoError(t, bob.Approve(ctx, batch, mustFingerprint(t, s, batch), "bob", "fallback checked"))
	require.Equal(t, backfill.RunRunning, equal("approved").Status)
	require.NoError(t, alice.SetKnob(ctx, batch, "concurrency", "1", "alice", "gentle"))
	require.Error(t, alice.SetKnob(ctx, batch, "rows_per_second", "fast", "alice", "refused"), "a refused decision records nothing")
	require.NoError(t, bob.Pause(ctx, batch, "bob", "lunch peak"))
	require.NoError(t, bob.SetKnob(ctx, batch, "rows_per_second", "5000", "bob", "cap"))
	require.NoError(t, bob.SetKnob(ctx, batch, "job_concurrency", "2", "bob", "two at once"))
	require.Equal(t, backfill.RunPaused, equal("paused").Status)
	require.NoError(t, alice.SetKnob(ctx, batch, "rows_per_second", "default", "alice", "no cap"))
	require.NoError(t, m.Resume(ctx, aliceDB, batch, "alice", "peak over"))
	require.Equal(t, backfill.RunRunning, equal("resumed").Status)

	rep, err = author.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]float64{"concurrency": 1, "job_concurrency": 2}, equal("completed").Knobs)

	pv, err := author.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Preview: true, Actor: "carol", Why: "what would it undo"})
	require.NoError(t, err)
	require.EqualValues(t, 1000, pv.Deleted)
	_, err = author.Rollback(ctx, job, backfill.RollbackOptions{BatchID: batch, Actor: "carol", Why: "wrong source", Force: true})
	require.NoError(t, err)
	final := equal("rolled back")
	require.Equal(t, backfill.RunRolledBack, final.Status)
	require.Equal(t, []string{"alice@" + aliceRole, "bob@" + bobRole}, final.Approvals)

	// Each decision names its actor, role and reason.
	var rows []struct {
		Kind   string          `db:"kind"`
		Actor  string          `db:"actor"`
		Role   string          `db:"db_role"`
		Detail json.RawMessage `db:"detail"`
	}
	require.NoError(t, s.db.Select(&rows, `SELECT kind, actor, db_role, detail FROM backfill.events WHERE batch_id = $1
		AND kind IN ('run_started', 'approval_recorded', 'run_paused', 'run_resumed_by_operator', 'knob_set', 'rollback_previewed', 'rollback') ORDER BY id`, batch))
	var kinds []string
	for _, r := range rows {
		kinds = append(kinds, r.Kind+" by "+r.Actor)
		require.NotEmpty(t, r.Role, r.Kind)
		var d map[string]any
		require.NoError(t, json.Unmarshal(r.Detail, &d))
		if r.Kind != "run_started" {
			require.NotEmpty(t, d["why"], r.Kind)
		}
	}
	require.Equal(t, []string{"run_started by author", "approval_recorded by alice", "approval_recorded by bob", "knob_set by alice",
		"run_paused by bob", "knob_set by bob", "knob_set by bob", "knob_set by alice", "run_resumed_by_operator by alice",
		"rollback_previewed by carol", "rollback by carol"}, kinds)
	_, err = s.db.Exec(`UPDATE backfill.events SET actor = 'mallory' WHERE batch_id = $1`, batch)
	require.ErrorContains(t, err, "append-only")
}

func mustFingerprint(t *testing.T, s *approvalSetup, batch int64) string {
	t.Helper()
	var fp string
	require.NoError(t, s.db.Get(&fp, `SELECT plan_fingerprint FROM backfill.runs WHERE batch_id = $1`, batch))
	return fp
}
