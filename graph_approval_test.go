package backfill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
)

// graphRows is the rows of the graph's target tables, with a checksum
// of each.
func graphRows(t *testing.T, db *sqlx.DB, tables ...string) string {
	t.Helper()
	s := ""
	for _, tb := range tables {
		var n int
		var sum string
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %q`, tb)))
		require.NoError(t, db.Get(&sum, fmt.Sprintf(`SELECT md5(coalesce(string_agg(id || ':' || v, ',' ORDER BY id), '')) FROM %q`, tb)))
		s += fmt.Sprintf("%s:%d:%s ", tb, n, sum)
	}
	return s
}

// TestGraphApprovalsAndFlags: a graph with an approval policy awaits
// approvals of its fingerprint before any module's job has a run; a
// module enabled later is a recorded plan change (audit event with
// actor, role, old and new value; the blueprint's diff) that abandons
// the run awaiting approval, so its approvals cannot complete; the new
// plan's run needs its own, the author and a stale fingerprint are
// refused, and the audit replays into the flags and the status.
func TestGraphApprovalsAndFlags(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	g := backfill.Graph{Name: "flights_plan", Approval: backfill.ApprovalPolicy{Approvers: 2}, Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphTable(t, db, "ap_airports", 10, nil)}},
		{Name: "stats", Jobs: []backfill.Job{graphTable(t, db, "ap_stats", 20, nil)}, DependsOn: []string{"airports"}, Disabled: true},
	}}
	author, err := backfill.New(db, &backfill.Config{WorkerID: "author", ReturnOnPause: true})
	require.NoError(t, err)
	aliceRole, aliceDB := s.operator(t, "alice")
	_, bobDB := s.operator(t, "bob")
	alice, err := backfill.New(aliceDB, nil)
	require.NoError(t, err)
	bob, err := backfill.New(bobDB, nil)
	require.NoError(t, err)
	jobRuns := func() int {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.runs WHERE job_name IN ('ap_airports', 'ap_stats')`))
		return n
	}
	empty := graphRows(t, db, "ap_airports", "ap_stats")

	bp, err := author.GraphBlueprint(ctx, g)
	require.NoError(t, err)
	require.Contains(t, bp.Text(), "Blueprint of graph \"flights_plan\"")
	require.Contains(t, bp.Text(), "module.stats.enabled:")
	rep, err := author.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	require.Equal(t, backfill.RunAwaitingApproval, rep.Status)
	require.Equal(t, bp.Fingerprint, rep.Fingerprint)
	require.ErrorContains(t, err, "0 of 2 approvals of plan fingerprint "+rep.Fingerprint)
	first, fp1 := rep.BatchID, rep.Fingerprint
	require.Zero(t, jobRuns(), "no module's job has a run before the approvals")
	require.NoError(t, alice.Approve(ctx, first, fp1, "alice", "airports only, first"))

	// Enabling stats is a plan change: recorded, and the run awaiting
	// approval is abandoned with the approval it had.
	err = alice.SetModuleEnabled(ctx, g.Name, "stats", true, "", "no actor")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	err = alice.SetModuleEnabled(ctx, g.Name, "planes", true, "alice", "unknown")
	require.ErrorIs(t, err, backfill.ErrRunNotFound)
	require.ErrorContains(t, err, `graph 'flights_plan' has no module 'planes' (its modules: airports, stats)`)
	err = author.SetModuleEnabled(ctx, "no_graph", "stats", true, "alice", "no run")
	require.ErrorIs(t, err, backfill.ErrRunNotFound)
	require.NoError(t, alice.SetModuleEnabled(ctx, g.Name, "stats", true, "alice", "confidence grew"))
	require.NoError(t, alice.SetModuleEnabled(ctx, g.Name, "stats", true, "alice", "again: no change, no record"))
	err = bob.Approve(ctx, first, fp1, "bob", "late for the old plan")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "it is abandoned, not awaiting_approval")

	var ev struct {
		Actor  string          `db:"actor"`
		Role   string          `db:"db_role"`
		Detail json.RawMessage `db:"detail"`
	}
	require.NoError(t, db.Get(&ev, `SELECT actor, db_role, detail FROM backfill.events WHERE kind = 'module_flag_set'`))
	require.Equal(t, "alice", ev.Actor)
	require.Equal(t, aliceRole, ev.Role)
	require.JSONEq(t, fmt.Sprintf(`{"graph": "flights_plan", "module": "stats", "old": false, "new": true, "why": "confidence grew", "abandoned": %d}`, first), string(ev.Detail))

	// The audit of the first run replays into its state and the flags.
	m := backfill.NewPGManifest("")
	events, err := m.Events(ctx, db, first)
	require.NoError(t, err)
	replayed := backfilltype.ReplayControl(events)
	flags, err := m.ModuleFlags(ctx, db, g.Name)
	require.NoError(t, err)
	require.Equal(t, flags, replayed.Modules)
	require.Equal(t, map[string]bool{"stats": true}, replayed.Modules)
	ctl, err := m.Control(ctx, db, first)
	require.NoError(t, err)
	require.Equal(t, ctl.Status, replayed.Status)
	require.Equal(t, backfill.RunAbandoned, replayed.Status)
	require.Equal(t, []string{"alice@" + aliceRole}, replayed.Approvals)

	// The blueprint shows the change; the new plan awaits its own
	// approvals.
	bp, err = author.GraphBlueprint(ctx, g)
	require.NoError(t, err)
	require.NotEqual(t, fp1, bp.Fingerprint)
	require.Contains(t, bp.Changes, `module.stats.enabled: "false" -> "true"`)
	require.Equal(t, first, bp.Previous.BatchID)
	rep, err = author.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	second, fp2 := rep.BatchID, rep.Fingerprint
	require.Equal(t, bp.Fingerprint, fp2)
	require.NotEqual(t, first, second)
	err = bob.Approve(ctx, second, fp1, "bob", "the old fingerprint")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "stale fingerprint")
	err = author.Approve(ctx, second, fp2, "author", "my own plan")
	require.ErrorIs(t, err, backfill.ErrApprovalRefused)
	require.ErrorContains(t, err, "is its author")
	require.Zero(t, jobRuns())
	require.Equal(t, empty, graphRows(t, db, "ap_airports", "ap_stats"), "nothing written")

	require.NoError(t, alice.Approve(ctx, second, fp2, "alice", "both modules"))
	require.NoError(t, bob.Approve(ctx, second, fp2, "bob", "both modules"))
	rep, err = author.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, second, rep.BatchID)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]string{"airports": "completed", "stats": "completed"}, moduleStates(rep.Modules))
	requireGraphOrder(t, db, "ap_stats", "ap_airports")

	// Disabling a module of a completed graph: the next plan runs
	// nothing of it, and the status says so.
	require.NoError(t, alice.SetModuleEnabled(ctx, g.Name, "airports", false, "alice", "source retired"))
	st, err := author.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, second, st.BatchID, "a completed run is not abandoned")
	bp, err = author.GraphBlueprint(ctx, g)
	require.NoError(t, err)
	require.Contains(t, bp.Changes, `module.airports.enabled: "true" -> "false"`)
}

// TestGraphDisabledModuleHoldsDependents: a disabled module's jobs do
// not run and its dependents are held (the status says by which); the
// others run.
func TestGraphDisabledModuleHoldsDependents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	g := backfill.Graph{Name: "dis", Modules: []backfill.Module{
		{Name: "a", Jobs: []backfill.Job{graphTable(t, db, "dis_a", 10, nil)}, Disabled: true},
		{Name: "b", Jobs: []backfill.Job{graphTable(t, db, "dis_b", 10, nil)}, DependsOn: []string{"a"}},
		{Name: "c", Jobs: []backfill.Job{graphTable(t, db, "dis_c", 10, nil)}, DependsOn: []string{"b"}},
		{Name: "d", Jobs: []backfill.Job{graphTable(t, db, "dis_d", 10, nil)}},
	}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrGraphIncomplete)
	require.ErrorContains(t, err, "b held (held by module a (disabled))")
	want := map[string]string{"a": "disabled", "b": "held by a", "c": "held by a", "d": "completed"}
	require.Equal(t, want, moduleStates(rep.Modules))
	st, err := r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, want, moduleStates(st.Modules))
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs WHERE job_name IN ('dis_a', 'dis_b', 'dis_c')`))
	require.Zero(t, runs)
	require.Equal(t, "dis_d:40", func() string {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM dis_d`))
		return fmt.Sprintf("dis_d:%d", n)
	}())
	_, admin := s.operator(t, "ops")
	ops, err := backfill.New(admin, nil)
	require.NoError(t, err)
	require.NoError(t, ops.SetModuleEnabled(ctx, g.Name, "a", true, "ops", "source ready"))
	rep, err = r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "completed", "b": "completed", "c": "completed", "d": "completed"}, moduleStates(rep.Modules))
}

// TestRollbackModuleCascades: rolling back a module rolls back the
// modules that depend on it, children first, and leaves the other
// modules' rows identical (by checksum).
func TestRollbackModuleCascades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	g, _ := flightsGraph(t, db, nil)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.RunGraph(ctx, g)
	require.NoError(t, err)
	others := graphRows(t, db, "airports", "weather")
	_, err = r.RollbackModule(ctx, g, "flights", backfill.RollbackOptions{})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig, "actor and why required")
	_, err = r.RollbackModule(ctx, g, "planes", backfill.RollbackOptions{Actor: "ops", Why: "t"})
	require.ErrorContains(t, err, `graph "flights_graph" has no such module`)

	pv, err := r.RollbackModule(ctx, g, "flights", backfill.RollbackOptions{Preview: true, Actor: "ops", Why: "what would go"})
	require.NoError(t, err)
	require.Len(t, pv, 2)
	for _, p := range pv {
		require.True(t, p.Preview)
		require.EqualValues(t, 40, p.Deleted)
	}
	require.Equal(t, others, graphRows(t, db, "airports", "weather"), "a preview writes nothing")
	reps, err := r.RollbackModule(ctx, g, "flights", backfill.RollbackOptions{Actor: "ops", Why: "bad flights source"})
	require.NoError(t, err)
	require.Len(t, reps, 2)
	var order []string
	for _, rep := range reps {
		var job string
		require.NoError(t, db.Get(&job, `SELECT job_name FROM backfill.runs WHERE batch_id = $1`, rep.BatchID))
		order = append(order, job)
		require.EqualValues(t, 40, rep.Deleted)
		require.Equal(t, backfill.RunRolledBack, rep.Status)
	}
	require.Equal(t, []string{"route_stats", "flights"}, order, "children first")
	require.Equal(t, others, graphRows(t, db, "airports", "weather"), "the other modules' rows are identical")
	require.Equal(t, "flights:0:d41d8cd98f00b204e9800998ecf8427e route_stats:0:d41d8cd98f00b204e9800998ecf8427e ", graphRows(t, db, "flights", "route_stats"))
	st, err := r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "failed", "route_stats": "failed", "weather": "completed"}, moduleStates(st.Modules))
}

// TestGraphBlueprintGolden: a graph's blueprint lists its modules with
// their dependencies, priority, class, flag and jobs, each job's plan
// fingerprint and details, in a stable order (text and JSON); making it
// writes nothing.
func TestGraphBlueprintGolden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newApprovalSetup(t)
	db := s.db
	g := backfill.Graph{Name: "flights_bp", Approval: backfill.ApprovalPolicy{Approvers: 2}, Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphTable(t, db, "bp_airports", 10, nil)}, Priority: 2},
		{Name: "flights", Jobs: []backfill.Job{graphTable(t, db, "bp_flights", 20, nil)}, DependsOn: []string{"airports"}, Priority: 1},
		{Name: "route_stats", Jobs: []backfill.Job{graphTable(t, db, "bp_route_stats", 10, nil)}, DependsOn: []string{"flights", "airports"},
			Class: backfill.ModuleDeferrable, Disabled: true},
	}}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2, MemoryBudget: 48 << 20})
	require.NoError(t, err)
	b, err := r.GraphBlueprint(ctx, g)
	require.NoError(t, err)
	js, err := json.MarshalIndent(b, "", "  ")
	require.NoError(t, err)
	golden(t, "graph_blueprint.golden.json", string(js)+"\n")
	golden(t, "graph_blueprint.golden.txt", b.Text())
	// Every value starts in one column, after the longest field name.
	fields, _, _ := strings.Cut(b.Text(), "\nChanges")
	col := 0
	for _, line := range strings.Split(fields, "\n")[1:] {
		name, _, ok := strings.Cut(strings.TrimPrefix(line, "  "), ": ")
		require.True(t, ok, line)
		value := strings.TrimLeft(line[2+len(name)+1:], " ")
		if col == 0 {
			col = len(line) - len(value)
		}
		require.Equal(t, col, len(line)-len(value), "value of %s not aligned", name)
	}
	var n int
	require.NoError(t, db.Get(&n, `SELECT (SELECT count(*) FROM backfill.runs) + (SELECT count(*) FROM backfill.events)`))
	require.Zero(t, n, "a blueprint creates no run and records nothing")
	var back backfill.Blueprint
	require.NoError(t, json.Unmarshal(js, &back))
	require.Equal(t, b.Text(), back.Text())
}
