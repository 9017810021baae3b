package pgstore

import (
	"context"
	"encoding/json"
	"fmt"

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
		var runs []struct {
			BatchID     int64  `db:"batch_id"`
			Status      string `db:"status"`
			Fingerprint string `db:"plan_fingerprint"`
			Plan        []byte `db:"plan"`
		}
		if err := sqlx.SelectContext(ctx, tx, &runs, m.SQL(`SELECT batch_id, status, plan_fingerprint, plan FROM {s}.runs
			WHERE job_name = $1 AND plan ? 'modules' ORDER BY batch_id DESC LIMIT 1`), graph); err != nil {
			return err
		}
		if len(runs) == 0 {
			return fmt.Errorf("%w: graph %q has no run", backfilltype.ErrRunNotFound, graph)
		}
		var plan backfilltype.Plan
		if err := json.Unmarshal(runs[0].Plan, &plan); err != nil {
			return fmt.Errorf("plan of batch %d: %w", runs[0].BatchID, err)
		}
		st = backfilltype.GraphStatus{Graph: graph, BatchID: runs[0].BatchID, Status: backfilltype.RunStatus(runs[0].Status),
			Fingerprint: runs[0].Fingerprint, Modules: make([]backfilltype.ModuleStatus, len(plan.Modules))}
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
					return err
				}
				js := backfilltype.ModuleJobStatus{Job: j.Name}
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
				}
				ms.ChunksDone += js.ChunksDone
				ms.ChunksTotal += js.ChunksTotal
				ms.Rows += js.Rows
				ms.Jobs = append(ms.Jobs, js)
			}
			st.Modules[i] = ms
		}
		backfilltype.SettleModules(st.Modules)
		return nil
	})
	if err != nil {
		return backfilltype.GraphStatus{}, fmt.Errorf("backfill: status of graph %q: %w", graph, err)
	}
	return st, nil
}
