package backfill_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
)

// TestGraphStatusAwaitingApproval: the status of a graph awaiting
// approval shows its plan's chunks per module (no job has a run yet),
// the approvals so far with who gave them, and the command that records
// one.
func TestGraphStatusAwaitingApproval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	g := backfill.Graph{Name: "st_plan", Approval: backfill.ApprovalPolicy{Approvers: 2}, Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphTable(t, db, "st_airports", 10, nil)}},
		{Name: "flights", Jobs: []backfill.Job{graphTable(t, db, "st_flights", 20, nil), graphTable(t, db, "st_delays", 5, nil)}, DependsOn: []string{"airports"}},
	}}
	author, err := backfill.New(db, &backfill.Config{WorkerID: "author", ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := author.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	_, aliceDB := s.operator(t, "alice")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	require.NoError(t, alice.Approve(ctx, rep.BatchID, rep.Fingerprint, "alice", "airports first"))

	st, err := author.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, backfill.RunAwaitingApproval, st.Status)
	totals := map[string]int{}
	for _, m := range st.Modules {
		totals[m.Name] = m.ChunksTotal
		for _, j := range m.Jobs {
			require.Zero(t, j.BatchID, j.Job)
			totals[j.Job] = j.ChunksTotal
		}
	}
	require.Equal(t, map[string]int{"airports": 4, "st_airports": 4, "flights": 2 + 8, "st_flights": 2, "st_delays": 8}, totals)
	require.NotNil(t, st.Approval)
	require.Len(t, st.Approval.Approvals, 1)
	require.Equal(t, "alice", st.Approval.Approvals[0].Approver)
	require.Contains(t, st.Waiting, "1 of 2 approvals of plan fingerprint "+rep.Fingerprint)
	require.Contains(t, st.Waiting, fmt.Sprintf("backfill approve --batch %d --fingerprint %s", rep.BatchID, rep.Fingerprint))
	text := st.Text()
	require.Contains(t, text, "approvals 1 of 2 of plan fingerprint "+rep.Fingerprint+" (author ")
	require.Contains(t, text, " by alice (role ")
	require.Contains(t, text, "backfill approve --batch")
	require.Regexp(t, `(?m)^flights +pending +0/10 `, text)
}

// TestGraphStatusShowsParked: while a call of RunGraph holds on a
// throttle, GraphStatus (any process, from the manifest) shows the
// deferrable module parked with the signal that holds; the hold is a
// throttle period of the graph's run, closed when it releases.
func TestGraphStatusShowsParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	var r *backfill.Runner
	var during backfill.GraphStatus
	var duringErr error
	first := true
	orders := graphTable(t, db, "pk_orders", 5, func(c backfill.Chunk) error {
		if first {
			first = false
			during, duringErr = r.GraphStatus(ctx, "pk")
		}
		return nil
	})
	g := backfill.Graph{Name: "pk", Modules: []backfill.Module{
		{Name: "reports", Jobs: []backfill.Job{graphTable(t, db, "pk_reports", 5, nil)}, Class: backfill.ModuleDeferrable, Priority: 10},
		{Name: "orders", Jobs: []backfill.Job{orders}},
	}}
	var err error
	r, err = backfill.New(db, &backfill.Config{Concurrency: 1, ThrottleInterval: 10 * time.Millisecond,
		Throttles: []backfillthrottle.Throttle{{Signal: untilLoaded{table: "pk_orders", n: 40}, High: 1, Low: 0.5}}})
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"reports": "completed", "orders": "completed"}, moduleStates(rep.Modules))
	require.NoError(t, duringErr)
	require.Equal(t, map[string]string{"reports": "parked", "orders": "pending"}, moduleStates(during.Modules))
	require.Contains(t, during.Modules[0].Reason, "parked while a throttle holds: until_pk_orders (until_pk_orders 1 at or above high watermark 1)")
	require.Contains(t, during.Text(), "reports: deferrable: parked while a throttle holds")

	var open, periods int
	require.NoError(t, db.Get(&periods, `SELECT count(*) FROM backfill.throttle_periods WHERE batch_id = $1`, rep.BatchID))
	require.NoError(t, db.Get(&open, `SELECT count(*) FROM backfill.throttle_periods WHERE batch_id = $1 AND ended_at IS NULL`, rep.BatchID))
	require.Equal(t, 1, periods, "the hold is a throttle period of the graph's run")
	require.Zero(t, open)
}

// TestGraphErrorsSayBackfillOnce: the errors of the graph's calls
// (refusals, a graph incomplete, paused or awaiting approval, module
// flags, rollbacks of modules, status) name the library once: none says
// "backfill: backfill:".
func TestGraphErrorsSayBackfillOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	var errs []error
	note := func(_ any, err error) {
		t.Helper()
		require.Error(t, err)
		errs = append(errs, err)
	}
	a, b := graphTable(t, db, "eb_a", 10, nil), graphTable(t, db, "eb_b", 10, nil)
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	mod := func(name string, j backfill.Job, deps ...string) backfill.Module {
		return backfill.Module{Name: name, Jobs: []backfill.Job{j}, DependsOn: deps}
	}
	for _, g := range []backfill.Graph{
		{Name: "eb"},
		{Name: "eb", Modules: []backfill.Module{mod("a", a, "b"), mod("b", b, "a")}},
		{Name: "eb", Modules: []backfill.Module{mod("a", a, "x")}},
		{Name: "eb_a", Modules: []backfill.Module{mod("a", a)}},
	} {
		note(r.RunGraph(ctx, g))
		note(r.GraphBlueprint(ctx, g))
		note(r.RollbackModule(ctx, g, "a", backfill.RollbackOptions{Actor: "ops", Why: "t"}))
	}
	for _, g := range []backfill.Graph{
		{Name: "eb", Modules: []backfill.Module{mod("a", func() backfill.Job { j := a; j.NewRun = true; return j }())}},
		{Name: "eb", Modules: []backfill.Module{mod("a", func() backfill.Job { j := a; j.Approval.Approvers = 1; return j }())}},
		{Name: "eb", Modules: []backfill.Module{mod("a", func() backfill.Job { j := a; j.Publish.Mode = backfill.PublishAtEnd; return j }())}},
		{Name: "eb", Modules: []backfill.Module{mod("a", func() backfill.Job { j := a; j.Target.Table = "eb_missing"; return j }())}},
	} {
		note(r.RunGraph(ctx, g))
		note(r.GraphBlueprint(ctx, g))
	}
	note(r.GraphStatus(ctx, "eb_none"))
	note(nil, r.SetModuleEnabled(ctx, "eb_none", "a", true, "ops", "no run"))

	// A graph awaiting approval, then one failing, paused and
	// incomplete.
	g := backfill.Graph{Name: "eb", Approval: backfill.ApprovalPolicy{Approvers: 1}, Modules: []backfill.Module{mod("a", a), mod("b", b, "a")}}
	note(r.RunGraph(ctx, g))
	g.Approval = backfill.ApprovalPolicy{}
	g.Modules[0].Jobs[0].Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return fmt.Errorf("source down: %w", backfilltype.ErrNotRetryable)
	})
	note(r.RunGraph(ctx, g))
	note(r.RollbackModule(ctx, g, "x", backfill.RollbackOptions{Actor: "ops", Why: "t"}))
	note(r.RollbackModule(ctx, g, "a", backfill.RollbackOptions{Actor: "ops", Why: "t", BatchID: 1}))
	note(r.RollbackModule(ctx, g, "a", backfill.RollbackOptions{}))
	note(nil, r.SetModuleEnabled(ctx, "eb", "x", true, "ops", "unknown module"))
	note(nil, r.SetModuleEnabled(ctx, "eb", "a", true, "", "no actor"))
	st, err := r.GraphStatus(ctx, "eb")
	require.NoError(t, err)
	require.NoError(t, r.Pause(ctx, st.BatchID, "ops", "maintenance"))
	note(r.RunGraph(ctx, g))

	fakes, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: backfilltest.NewMerger()})
	require.NoError(t, err)
	note(fakes.GraphStatus(ctx, "eb"))
	note(nil, fakes.SetModuleEnabled(ctx, "eb", "a", true, "ops", "t"))

	for _, err := range errs {
		require.NotContains(t, err.Error(), "backfill: backfill:")
		// Nor after a sentinel's text ("backfill: run not found: ...").
		require.NotRegexp(t, `backfill: [a-z ]+: backfill: `, err.Error())
		require.True(t, strings.HasPrefix(err.Error(), "backfill: "), "%v", err)
	}
}
