package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ModuleFlags returns the flags switched for graph's modules (module
// name to enabled): the latest module_flag_set event of each in the
// audit log (migration 33); a module never switched is absent.
func (m *Manifest) ModuleFlags(ctx context.Context, db sqlx.ExtContext, graph string) (map[string]bool, error) {
	ctx = m.purpose(ctx, "read the module flags of graph "+graph, 0)
	var rows []struct {
		Module  string `db:"module"`
		Enabled bool   `db:"enabled"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT DISTINCT ON (detail->>'module') detail->>'module' AS module, (detail->>'new')::boolean AS enabled
			FROM {s}.events WHERE job_name = $1 AND kind = 'module_flag_set' ORDER BY detail->>'module', id DESC`), graph)
	})
	if err != nil {
		return nil, fmt.Errorf("backfill: module flags of graph %q: %w", graph, err)
	}
	flags := make(map[string]bool, len(rows))
	for _, r := range rows {
		flags[r.Module] = r.Enabled
	}
	return flags, nil
}

// SetModuleFlag switches module of graph on or off through the SQL
// function set_module_flag (an operator's), as actor for why. It returns
// "enabled", "disabled" or "unchanged". Its refusals map to sentinels as
// the control functions' do: a missing actor or reason ErrInvalidConfig,
// a graph with no run or an unknown module ErrRunNotFound, a role that may
// not execute it ErrPrivilege.
func (m *Manifest) SetModuleFlag(ctx context.Context, db sqlx.ExtContext, graph, module string, enabled bool, actor, why string) (string, error) {
	ctx = m.purpose(ctx, "switch a module flag of graph "+graph, 0)
	actor, why = ManifestText(actor), ManifestText(why)
	if err := controlCaps("set_module_flag", actor, why); err != nil {
		return "", fmt.Errorf("backfill: set module %q of graph %q: %w", module, graph, err)
	}
	var res string
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.controlPrivilege(ctx, tx, "set_module_flag(text, text, boolean, text, text)"); err != nil {
			return err
		}
		return sqlx.GetContext(ctx, tx, &res, m.SQL(`SELECT {s}.set_module_flag($1::text, $2::text, $3::boolean, $4::text, $5::text)`),
			ManifestText(graph), ManifestText(module), enabled, actor, why)
	})
	if err != nil {
		return "", fmt.Errorf("backfill: set module %q of graph %q: %w", module, graph, controlError(err, false))
	}
	return res, nil
}

// GraphStatus returns the progress of graph: its latest run (a run of
// the graph's name whose plan has modules) and, per module of that
// plan, the latest run of each job with the job's plan fingerprint
// (none: BatchID 0), chunks done (done or open) of total and rows read,
// settled into states ([backfilltype.SettleModules]). A graph with no
// run gives ErrRunNotFound. It reads in one snapshot.
func (m *Manifest) GraphStatus(ctx context.Context, db sqlx.ExtContext, graph string) (backfilltype.GraphStatus, error) {
	ctx = m.purpose(ctx, "status of graph "+graph, 0)
	var st backfilltype.GraphStatus
	err := SnapshotReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var runs []backfilltype.Run
		if err := sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT `+runColumns+` FROM {s}.runs
			WHERE job_name = $1 AND plan ? 'modules' ORDER BY batch_id DESC LIMIT 1`), graph); err != nil {
			return err
		}
		if len(runs) == 0 {
			return fmt.Errorf("%w: graph %q has no run", backfilltype.ErrRunNotFound, graph)
		}
		var err error
		st, err = m.graphStatus(ctx, tx, runs[0])
		return err
	})
	if err != nil {
		return backfilltype.GraphStatus{}, fmt.Errorf("backfill: status of graph %q: %w", graph, err)
	}
	return st, nil
}

// graphStatus is the progress of the graph whose run is run (its plan's
// modules), read in tx.
func (m *Manifest) graphStatus(ctx context.Context, tx sqlx.ExtContext, run backfilltype.Run) (backfilltype.GraphStatus, error) {
	var plan backfilltype.Plan
	if err := json.Unmarshal(run.Plan, &plan); err != nil {
		return backfilltype.GraphStatus{}, fmt.Errorf("plan of batch %d: %w", run.BatchID, err)
	}
	st := backfilltype.GraphStatus{Graph: run.Job, BatchID: run.BatchID, Status: run.Status,
		Fingerprint: run.Fingerprint, Modules: make([]backfilltype.ModuleStatus, len(plan.Modules))}
	approval, err := m.Approvals(ctx, tx, run.BatchID)
	if err != nil {
		return backfilltype.GraphStatus{}, err
	}
	if approval.Policy != nil {
		st.Approval = &approval
		if run.Status == backfilltype.RunAwaitingApproval {
			st.Waiting = AwaitingText(m.Schema(), approval)
		}
	}
	planned, err := m.plannedChunks(ctx, tx, run.BatchID)
	if err != nil {
		return backfilltype.GraphStatus{}, err
	}
	for i, pm := range plan.Modules {
		ms := backfilltype.ModuleStatus{Name: pm.Name, DependsOn: append([]string{}, pm.DependsOn...), Priority: pm.Priority, Class: pm.Class,
			Enabled: pm.Enabled, Jobs: []backfilltype.ModuleJobStatus{}}
		for _, j := range pm.Jobs {
			var jr []struct {
				BatchID   int64  `db:"batch_id"`
				Status    string `db:"status"`
				Total     int    `db:"chunks_total"`
				LastError string `db:"last_error"`
				Done      int    `db:"done"`
				Rows      int64  `db:"rows"`
			}
			if err := sqlx.SelectContext(ctx, tx, &jr, m.SQL(`SELECT r.batch_id, r.status, r.chunks_total, r.last_error,
					(SELECT count(*) FROM {s}.chunks c WHERE c.batch_id = r.batch_id AND c.status IN ('done', 'open')) AS done,
					(SELECT coalesce(sum(c.rows_read), 0) FROM {s}.chunks c WHERE c.batch_id = r.batch_id AND c.status IN ('done', 'open')) AS rows
				FROM {s}.runs r WHERE r.job_name = $1 AND r.plan_fingerprint = $2 AND r.status <> 'abandoned'
				ORDER BY r.batch_id DESC LIMIT 1`), j.Name, j.Fingerprint); err != nil {
				return backfilltype.GraphStatus{}, err
			}
			js := backfilltype.ModuleJobStatus{Job: j.Name, ChunksTotal: planned[j.Name]}
			if len(jr) == 1 {
				js = backfilltype.ModuleJobStatus{Job: j.Name, BatchID: jr[0].BatchID, Status: backfilltype.RunStatus(jr[0].Status),
					ChunksDone: jr[0].Done, ChunksTotal: jr[0].Total, Rows: jr[0].Rows}
				if (js.Status == backfilltype.RunFailed || js.Status == backfilltype.RunPaused) && jr[0].LastError != "" && ms.Reason == "" {
					ms.Reason = "job " + j.Name + ": " + jr[0].LastError
					ms.State = backfilltype.ModuleFailed
					if js.Status == backfilltype.RunPaused {
						ms.State = backfilltype.ModulePaused
					}
				}
				if js.Status == backfilltype.RunRunning && js.ChunksDone < js.ChunksTotal && ms.Waiting == "" {
					w, err := m.runWait(ctx, tx, js.BatchID)
					if err != nil {
						return backfilltype.GraphStatus{}, err
					}
					if w != "" {
						ms.Waiting = "job " + j.Name + ": " + w
					}
				}
			}
			ms.ChunksDone += js.ChunksDone
			ms.ChunksTotal += js.ChunksTotal
			ms.Rows += js.Rows
			ms.Jobs = append(ms.Jobs, js)
		}
		st.Modules[i] = ms
	}
	backfilltype.SettleModules(st.Modules)
	// The holds of the throttles of a live call of RunGraph (its
	// worker's open throttle periods on the graph's run) park the
	// deferrable modules that have chunks left.
	var holds *string
	if err := sqlx.GetContext(ctx, tx, &holds, m.SQL(`SELECT string_agg(DISTINCT p.signal || ' (' || p.reason || ')', ', ')
		FROM {s}.throttle_periods p JOIN {s}.workers w ON w.worker_key = p.worker_key
		WHERE p.batch_id = $1 AND p.ended_at IS NULL AND w.finished_at IS NULL AND w.heartbeat_at >= now() - w.stale_after`), run.BatchID); err != nil {
		return backfilltype.GraphStatus{}, err
	}
	for i := range st.Modules {
		ms := &st.Modules[i]
		if holds != nil && ms.Class == backfilltype.ModuleDeferrable && (ms.State == backfilltype.ModulePending || ms.State == backfilltype.ModuleRunning) {
			ms.State, ms.Reason = backfilltype.ModuleParked, "deferrable: parked while a throttle holds: "+*holds
		}
		if ms.State != backfilltype.ModulePending && ms.State != backfilltype.ModuleRunning {
			ms.Waiting = ""
		}
	}
	return st, nil
}

// plannedChunks returns the number of chunks of each job's plan (by job
// name) in the latest blueprint recorded for the graph's run batchID
// (empty when none is).
func (m *Manifest) plannedChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) (map[string]int, error) {
	var details [][]byte
	if err := sqlx.SelectContext(ctx, tx, &details, m.SQL(`SELECT detail FROM {s}.events
		WHERE batch_id = $1 AND kind = $2 ORDER BY id DESC LIMIT 1`), batchID, backfilltype.EventBlueprint); err != nil {
		return nil, err
	}
	out := map[string]int{}
	if len(details) == 0 {
		return out, nil
	}
	var b backfilltype.Blueprint
	if err := json.Unmarshal(details[0], &b); err != nil {
		return nil, fmt.Errorf("blueprint of batch %d: %w", batchID, err)
	}
	for _, mod := range b.Modules {
		for _, j := range mod.Jobs {
			out[j.Name] = j.Chunks
		}
	}
	return out, nil
}

// runWait says what the unfinished chunks of running run batchID wait
// for, when the manifest knows: a session of a live worker of the run
// waiting for a lock now, with the session that blocks it; else the
// latest recorded wait (waits) of a chunk not loaded, unless a chunk of
// the run was checkpointed after it. "" for neither.
func (m *Manifest) runWait(ctx context.Context, tx sqlx.ExtContext, batchID int64) (string, error) {
	var liveJS string
	if err := sqlx.GetContext(ctx, tx, &liveJS, m.SQL(`SELECT `+lockWaitsSQL), batchID); err != nil {
		return "", err
	}
	var live []backfilltype.LockWait
	if err := json.Unmarshal([]byte(liveJS), &live); err != nil {
		return "", fmt.Errorf("lock waits of batch %d: %w", batchID, err)
	}
	if len(live) > 0 {
		// The longest wait whose blocker is known (a wait just begun, or
		// one on another chunk's advisory lock, may show none yet).
		w := live[0]
		if i := slices.IndexFunc(live, func(l backfilltype.LockWait) bool { return l.BlockerPID != 0 }); i >= 0 {
			w = live[i]
		}
		s := fmt.Sprintf("a chunk's session waits for a lock (%s) since %.0f s", w.WaitEvent, w.Seconds)
		if w.BlockerPID != 0 {
			s += fmt.Sprintf(", blocked by pid %d (application_name %q, user %q, %s, query %q)", w.BlockerPID, w.BlockerApp, w.BlockerUser, w.BlockerState, w.BlockerQuery)
		}
		return s, nil
	}
	var rows []struct {
		ChunkID  string    `db:"chunk_id"`
		SQLState string    `db:"sqlstate"`
		Message  string    `db:"message"`
		Blockers []byte    `db:"blockers"`
		At       time.Time `db:"at"`
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT w.chunk_id, w.sqlstate, w.message, w.blockers, w.at
		FROM {s}.waits w JOIN {s}.chunks c ON c.batch_id = w.batch_id AND c.seq = w.seq
		WHERE w.batch_id = $1 AND c.status NOT IN ('done', 'open')
			AND w.at >= coalesce((SELECT max(x.checkpointed_at) FROM {s}.chunks x WHERE x.batch_id = $1), '-infinity')
		ORDER BY w.id DESC LIMIT 1`), batchID); err != nil {
		return "", err
	}
	if len(rows) == 0 {
		return "", nil
	}
	w := rows[0]
	var bs []backfilltype.Blocker
	if err := json.Unmarshal(w.Blockers, &bs); err != nil {
		return "", fmt.Errorf("waits of batch %d: blockers: %w", batchID, err)
	}
	blockers := DescribeBlockers(bs)
	if blockers == "" {
		blockers = "none seen"
	}
	return fmt.Sprintf("chunk %s waited at %s (%s %s) and is tried again; blocked by %s", w.ChunkID, w.At.UTC().Format("2006-01-02 15:04:05Z"), w.SQLState, w.Message, blockers), nil
}
