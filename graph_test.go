package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// graphTable creates table (id, v and lineage columns: rollback by undo
// log) and returns a job loading ids [0, 40) into it in chunks of step;
// before, when set, runs first in each chunk's extraction.
func graphTable(t *testing.T, db *sqlx.DB, table string, step int64, before func(c backfill.Chunk) error) backfill.Job {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`, table))
	require.NoError(t, err)
	return graphJobOf(table, step, before)
}

// graphJobOf is graphTable's job, the table created already.
func graphJobOf(table string, step int64, before func(c backfill.Chunk) error) backfill.Job {
	return backfill.Job{
		Name:        table,
		Chunker:     backfill.IntRange(0, 40, step),
		ChunkColumn: "id",
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if before != nil {
				if err := before(c); err != nil {
					return err
				}
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprintf("%s-%d", table, id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "v"}},
	}
}

// parentsLoaded returns a check for a child's chunk: every row of its
// interval is committed in each parent table, read on another
// connection; a miss is recorded in violations.
func parentsLoaded(db *sqlx.DB, mu *sync.Mutex, violations *[]string, child string, parents ...string) func(c backfill.Chunk) error {
	return func(c backfill.Chunk) error {
		for _, p := range parents {
			var n int64
			if err := db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %q WHERE id >= $1 AND id < $2`, p), c.Lo, c.Hi); err != nil {
				return err
			}
			if n != c.Hi-c.Lo {
				mu.Lock()
				*violations = append(*violations, fmt.Sprintf("%s chunk %s ran with %d of %d rows of %s", child, c.ID, n, c.Hi-c.Lo, p))
				mu.Unlock()
			}
		}
		return nil
	}
}

// requireGraphOrder asserts from the manifest that no done chunk of
// child's runs started before an overlapping chunk of parent's runs
// finished, and that some overlap.
func requireGraphOrder(t *testing.T, db *sqlx.DB, child, parent string) {
	t.Helper()
	var o struct {
		Pairs int `db:"pairs"`
		Bad   int `db:"bad"`
	}
	require.NoError(t, db.Get(&o, `SELECT count(*) AS pairs, count(*) FILTER (WHERE p.status <> 'done' OR c.started_at < p.finished_at) AS bad
		FROM backfill.chunks c JOIN backfill.runs rc ON rc.batch_id = c.batch_id, backfill.chunks p JOIN backfill.runs rp ON rp.batch_id = p.batch_id
		WHERE rc.job_name = $1 AND rp.job_name = $2 AND c.status = 'done' AND rc.status <> 'abandoned' AND rp.status <> 'abandoned'
			AND int8range(c.lo, c.hi) && int8range(p.lo, p.hi)`, child, parent))
	require.Positive(t, o.Pairs, "%s and %s have overlapping chunks", child, parent)
	require.Zero(t, o.Bad, "a chunk of %s started before an overlapping chunk of %s was committed", child, parent)
}

// flightsGraph is airports, flights (after airports, chunks twice as
// wide), route_stats (after flights) and an independent weather module
// of the highest priority, each job checking in its extraction that its
// parents' rows of its interval are committed.
func flightsGraph(t *testing.T, db *sqlx.DB, fail func(job string, c backfill.Chunk) error) (backfill.Graph, *[]string) {
	t.Helper()
	var mu sync.Mutex
	violations := &[]string{}
	check := func(job string, parents ...string) func(c backfill.Chunk) error {
		loaded := parentsLoaded(db, &mu, violations, job, parents...)
		return func(c backfill.Chunk) error {
			if fail != nil {
				if err := fail(job, c); err != nil {
					return err
				}
			}
			return loaded(c)
		}
	}
	g := backfill.Graph{Name: "flights_graph", Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphTable(t, db, "airports", 10, check("airports"))}},
		{Name: "flights", Jobs: []backfill.Job{graphTable(t, db, "flights", 20, check("flights", "airports"))}, DependsOn: []string{"airports"}},
		{Name: "route_stats", Jobs: []backfill.Job{graphTable(t, db, "route_stats", 10, check("route_stats", "flights", "airports"))},
			DependsOn: []string{"flights"}, Class: backfill.ModuleDeferrable},
		{Name: "weather", Jobs: []backfill.Job{graphTable(t, db, "weather", 5, check("weather"))}, Priority: 5},
	}}
	return g, violations
}

func moduleStates(ms []backfill.ModuleStatus) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		s := string(m.State)
		if m.HeldBy != "" {
			s += " by " + m.HeldBy
		}
		out[m.Name] = s
	}
	return out
}

// TestRunGraphDependencyOrder runs a graph of four modules at
// Concurrency 3: every module completes, every row is loaded once, and
// no child's chunk ran before its parents' overlapping chunks were
// committed (seen by the child's extraction and by the manifest's
// times). A second call changes nothing.
func TestRunGraphDependencyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	g, violations := flightsGraph(t, db, nil)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 3})
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 4+2+4+8, rep.Chunks)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "completed", "route_stats": "completed", "weather": "completed"}, moduleStates(rep.Modules))
	for _, m := range rep.Modules {
		require.Equal(t, m.ChunksTotal, m.ChunksDone, m.Name)
		require.EqualValues(t, 40, m.Rows, m.Name)
	}
	require.Empty(t, *violations)
	for _, tb := range []string{"airports", "flights", "route_stats", "weather"} {
		var n int
		require.NoError(t, db.Get(&n, fmt.Sprintf(`SELECT count(*) FROM %q`, tb)))
		require.Equal(t, 40, n, tb)
	}
	requireGraphOrder(t, db, "flights", "airports")
	requireGraphOrder(t, db, "route_stats", "flights")

	st, err := r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, rep.BatchID, st.BatchID)
	require.Equal(t, backfill.RunCompleted, st.Status)
	require.Equal(t, moduleStates(rep.Modules), moduleStates(st.Modules))

	again, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, rep.BatchID, again.BatchID)
	require.Zero(t, again.Chunks)
}

// TestRunGraphFailureHoldsDescendants: a module whose chunk fails for
// good holds the modules that depend on it, and only them; the next
// call resumes it and completes the graph, in order.
func TestRunGraphFailureHoldsDescendants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	var broken atomic.Bool
	broken.Store(true)
	g, violations := flightsGraph(t, db, func(job string, c backfill.Chunk) error {
		if job == "flights" && c.Seq == 1 && broken.Load() {
			return fmt.Errorf("flights source down: %w", backfilltype.ErrNotRetryable)
		}
		return nil
	})
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrGraphIncomplete)
	require.ErrorContains(t, err, "flights failed")
	require.ErrorContains(t, err, "route_stats held (held by module flights (failed))")
	require.Equal(t, map[string]string{"airports": "completed", "flights": "failed", "route_stats": "held by flights", "weather": "completed"}, moduleStates(rep.Modules))
	require.Equal(t, backfill.RunRunning, rep.Status)
	st, err := r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, moduleStates(rep.Modules), moduleStates(st.Modules))
	require.Contains(t, st.Modules[1].Reason, "flights source down")

	broken.Store(false)
	rep, err = r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "completed", "route_stats": "completed", "weather": "completed"}, moduleStates(rep.Modules))
	require.Empty(t, *violations)
	requireGraphOrder(t, db, "flights", "airports")
	requireGraphOrder(t, db, "route_stats", "flights")
}

// TestGraphRefusals: a graph that cannot be planned is refused with an
// error naming the culprit, and nothing is written.
func TestGraphRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	a, b, c := graphTable(t, db, "ra", 10, nil), graphTable(t, db, "rb", 10, nil), graphTable(t, db, "rc", 10, nil)
	mod := func(name string, jobs []backfill.Job, deps ...string) backfill.Module {
		return backfill.Module{Name: name, Jobs: jobs, DependsOn: deps}
	}
	one := func(j backfill.Job) []backfill.Job { return []backfill.Job{j} }
	// The manifest exists: a blueprint migrates it and writes nothing else.
	_, err = r.GraphBlueprint(ctx, backfill.Graph{Name: "ok", Modules: []backfill.Module{mod("a", one(a))}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		g    backfill.Graph
		want string
	}{
		{"cycle", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a), "c"), mod("b", one(b), "a"), mod("c", one(c), "b")}},
			`the dependencies form a cycle: "a" -> "c" -> "b" -> "a" (each depends on the next)`},
		{"self", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a), "a")}}, `cycle: "a" -> "a"`},
		{"unknown", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a)), mod("b", one(b), "a", "planes")}},
			`module "b" depends on unknown module "planes"`},
		{"duplicate", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a)), mod("a", one(b))}}, `duplicate module name "a"`},
		{"job in two", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a)), mod("b", []backfill.Job{b, a})}},
			`job "ra" is in two modules: "a" and "b"`},
		{"empty", backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(a)), mod("b", nil)}}, `module "b" is empty: it has no jobs`},
		{"no modules", backfill.Graph{Name: "g"}, "no modules"},
		{"graph named as a job", backfill.Graph{Name: "ra", Modules: []backfill.Module{mod("a", one(a))}}, `job "ra" has the graph's name`},
	} {
		_, err := r.RunGraph(ctx, tc.g)
		require.ErrorIs(t, err, backfill.ErrInvalidConfig, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		_, err = r.GraphBlueprint(ctx, tc.g)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	withApproval := a
	withApproval.Approval = backfill.ApprovalPolicy{Approvers: 1}
	_, err = r.RunGraph(ctx, backfill.Graph{Name: "g", Modules: []backfill.Module{mod("a", one(withApproval))}})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, `job "ra": backfill: invalid configuration: Job.Approval is not for a graph's job: set Graph.Approval`)

	var runs, events, rows int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.NoError(t, db.Get(&events, `SELECT count(*) FROM backfill.events`))
	require.NoError(t, db.Get(&rows, `SELECT (SELECT count(*) FROM ra) + (SELECT count(*) FROM rb) + (SELECT count(*) FROM rc)`))
	require.Zero(t, runs+events+rows, "nothing written")
	require.False(t, errors.Is(err, backfill.ErrGraphIncomplete))
}

// TestRunGraphOnFakes: a graph runs against the fakes of backfilltest
// (the manifest and merger in memory), in dependency order.
func TestRunGraphOnFakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := backfilltest.NewMerger()
	cols := []backfill.Column{{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true}, {Name: "v", Type: "text", BaseType: "text"}}
	var order []string
	var mu sync.Mutex
	job := func(table string, step int64) backfill.Job {
		m.AddTableColumns(table, []string{"id"}, cols...)
		j := graphJobOf(table, step, func(c backfill.Chunk) error {
			mu.Lock()
			order = append(order, fmt.Sprintf("%s %s", table, c.ID))
			mu.Unlock()
			return nil
		})
		j.Rollback = backfill.RollbackNone
		return j
	}
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: m})
	require.NoError(t, err)
	g := backfill.Graph{Name: "fake", Modules: []backfill.Module{
		{Name: "child", Jobs: []backfill.Job{job("child", 20)}, DependsOn: []string{"parent"}},
		{Name: "parent", Jobs: []backfill.Job{job("parent", 20)}},
	}}
	rep, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, map[string]string{"child": "completed", "parent": "completed"}, moduleStates(rep.Modules))
	require.Len(t, m.Rows("parent"), 40)
	require.Len(t, m.Rows("child"), 40)
	// One chunk at a time: a child's chunk as soon as its parent's
	// interval is loaded (the child is listed first: ties go to it).
	require.Equal(t, []string{"parent int:0/20", "child int:0/20", "parent int:20/40", "child int:20/40"}, order)
}

// TestRunGraphGatedModuleHoldsDescendants: a module whose validation
// gate fails (its run paused) holds the modules that depend on it and
// only them; once resumed, the next call completes the graph.
func TestRunGraphGatedModuleHoldsDescendants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	g, violations := flightsGraph(t, db, nil)
	var strict atomic.Bool
	strict.Store(true)
	g.Modules[1].Jobs[0].Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
		return backfill.CheckResult{Check: "no_second_half", Severity: backfill.SeverityError, Passed: !strict.Load() || s.Chunk.Lo < 20, Expected: "a chunk before 20", Actual: s.Chunk.ID}, nil
	})}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	rep, err := r.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrGraphIncomplete)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "paused", "route_stats": "held by flights", "weather": "completed"}, moduleStates(rep.Modules))
	require.Contains(t, rep.Modules[1].Reason, "no_second_half")
	st, err := r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Equal(t, moduleStates(rep.Modules), moduleStates(st.Modules))

	strict.Store(false)
	require.NoError(t, backfill.NewPGManifest("").ResumeRun(ctx, db, rep.Modules[1].Jobs[0].BatchID, "ops", "check relaxed"))
	rep, err = r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"airports": "completed", "flights": "completed", "route_stats": "completed", "weather": "completed"}, moduleStates(rep.Modules))
	require.Empty(t, *violations)
	requireGraphOrder(t, db, "route_stats", "flights")
}

// rejectingJob creates table (id, amount numeric(10,2), lineage) and
// returns a job whose every row is rejected (an amount the column cannot
// hold), with the run reject gate off and a warning check that records
// each chunk's rows read.
func rejectingJob(t *testing.T, db *sqlx.DB, table string) backfill.Job {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, amount numeric(10,2), backfill_inserted_by bigint, backfill_updated_by bigint)`, table))
	require.NoError(t, err)
	return backfill.Job{
		Name:             table,
		Chunker:          backfill.IntRange(0, 20, 10),
		ChunkColumn:      "id",
		MaxRunRejectRate: -1,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, "1e20"); err != nil {
					return err
				}
			}
			return nil
		}),
		Validators: []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
			return backfill.CheckResult{Check: "rows_read", Severity: backfill.SeverityWarn, Passed: s.Counts.Read == 10, Expected: "10", Actual: fmt.Sprint(s.Counts.Read)}, nil
		})},
		Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "amount"}},
	}
}

// TestRunGraphJudgesRunEndAsRun: a job run through RunGraph is judged at
// its run's end as through Run: every row rejected with the run reject
// gate off, both pause the job's run ("no row loaded"), with the same
// validations, reason and events recorded; the module is paused and
// holds its dependent. Resumed, the next call completes the graph.
func TestRunGraphJudgesRunEndAsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	alone, err := r.Run(ctx, rejectingJob(t, db, "end_alone"))
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, alone.Status)

	// Each chunk of after overlaps one of loads: the one whose parent
	// chunk is loaded last cannot start before loads is judged.
	after := graphTable(t, db, "end_after", 10, nil)
	after.Chunker = backfill.IntRange(0, 20, 10)
	g := backfill.Graph{Name: "end_graph", Modules: []backfill.Module{
		{Name: "loads", Jobs: []backfill.Job{rejectingJob(t, db, "end_in_graph")}},
		{Name: "after", Jobs: []backfill.Job{after}, DependsOn: []string{"loads"}},
	}}
	rep, err := r.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrGraphIncomplete)
	require.Equal(t, map[string]string{"loads": "paused", "after": "held by loads"}, moduleStates(rep.Modules))
	require.Contains(t, rep.Modules[0].Reason, "no row loaded: all 20 rows read were rejected")
	inGraph := rep.Modules[0].Jobs[0].BatchID

	type judged struct {
		Status     string
		Reason     string
		Events     []string
		Validation []string
	}
	judgedOf := func(batchID int64) judged {
		var j judged
		var lastError string
		require.NoError(t, db.QueryRow(`SELECT status, last_error FROM backfill.runs WHERE batch_id = $1`, batchID).Scan(&j.Status, &lastError))
		j.Reason, _, _ = strings.Cut(lastError, ";")
		require.NoError(t, db.Select(&j.Events, `SELECT kind FROM backfill.events WHERE batch_id = $1 AND kind LIKE 'run\_%' ORDER BY id`, batchID))
		require.NoError(t, db.Select(&j.Validation, `SELECT chunk_id || ' ' || check_name || ' ' || passed || ' ' || expected || ' ' || actual
			FROM backfill.validations WHERE batch_id = $1 ORDER BY chunk_id, id`, batchID))
		return j
	}
	want := judgedOf(alone.BatchID)
	require.Equal(t, "paused", want.Status)
	require.Len(t, want.Validation, 2)
	require.Equal(t, want, judgedOf(inGraph))

	require.NoError(t, backfill.NewPGManifest("").ResumeRun(ctx, db, inGraph, "ops", "the source is empty on purpose"))
	rep, err = r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"loads": "completed", "after": "completed"}, moduleStates(rep.Modules))
}

// TestRunGraphLockedModuleLeavesSlots: while another session holds a
// lock on the target of one module (of many chunks, listed first), its
// chunks come back unloaded, and an independent module still gets a
// slot and completes; GraphStatus says what the locked module waits for
// (the session that holds the lock). Once the lock is released, the
// graph completes.
func TestRunGraphLockedModuleLeavesSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	g := backfill.Graph{Name: "lk", Modules: []backfill.Module{
		{Name: "locked", Jobs: []backfill.Job{graphTable(t, db, "lk_locked", 1, nil)}},
		{Name: "free", Jobs: []backfill.Job{graphTable(t, db, "lk_free", 10, nil)}},
	}}
	lock, err := db.Beginx()
	require.NoError(t, err)
	defer func() { _ = lock.Rollback() }()
	_, err = lock.Exec(`LOCK TABLE lk_locked IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	var lockPID int
	require.NoError(t, lock.Get(&lockPID, `SELECT pg_backend_pid()`))

	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	type result struct {
		rep backfill.GraphReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := r.RunGraph(ctx, g)
		done <- result{rep, err}
	}()
	// Until the free module completes and the locked one's wait is
	// known: a bound for a hang (the locked module holding every slot),
	// not a timing goal.
	deadline := time.Now().Add(2 * time.Minute)
	var st backfill.GraphStatus
	for {
		st, err = r.GraphStatus(ctx, g.Name)
		// The wait shown is a moment's: a chunk's session may be between
		// two tries, or wait on another's advisory lock; it names the
		// holder of the table's lock once it is the longest wait.
		if err == nil && st.Modules[1].State == backfilltype.ModuleCompleted && strings.Contains(st.Modules[0].Waiting, fmt.Sprintf("pid %d ", lockPID)) {
			break
		}
		select {
		case res := <-done:
			t.Fatalf("RunGraph returned while the lock was held: %v", res.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the free module did not complete while lk_locked was locked: %+v (%v)", st.Modules, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, backfilltype.ModulePending, st.Modules[0].State)
	require.Contains(t, st.Modules[0].Waiting, "job lk_locked: ")
	require.Contains(t, st.Modules[0].Waiting, fmt.Sprintf("pid %d ", lockPID), "the session holding the lock")
	require.Contains(t, st.Text(), "locked: waiting: job lk_locked: ")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM lk_free`))
	require.Equal(t, 40, n)

	require.NoError(t, lock.Rollback())
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, map[string]string{"locked": "completed", "free": "completed"}, moduleStates(res.rep.Modules))
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM lk_locked`))
	require.Equal(t, 40, n)
	st, err = r.GraphStatus(ctx, g.Name)
	require.NoError(t, err)
	require.Empty(t, st.Modules[0].Waiting)
}
