package backfill

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// ExitCode is the outcome of [Work] as a process exit status, for
// schedulers (Kubernetes Jobs, Airflow, systemd, cron) that start N
// workers on N hosts for one job and decide from the exit status what to
// do next.
type ExitCode int

// The exit-code contract of [Work].
const (
	// ExitDone (0): the run is completed, by this worker or by others
	// (including a run that was already completed or rolled back, which
	// Work does not run again). Do not restart.
	ExitDone ExitCode = 0
	// ExitFailed (1): the run failed: a chunk failed for good (its
	// attempts exhausted, or an error that is not retryable, such as an
	// extractor bug), a rollback of the batch that was interrupted (the
	// batch is neither in place nor withdrawn: finish the rollback), or an
	// error the library cannot classify. The run's last_error and the
	// chunk's in the manifest, or the worker's log, say why. Do not restart
	// blindly: restarting resumes the run and retries the failed chunks,
	// which helps only once the cause is fixed.
	ExitFailed ExitCode = 1
	// ExitUsage (64, EX_USAGE): the job, the configuration or the
	// deployment is wrong (ErrInvalidConfig, ErrInvalidScope,
	// ErrPlanChanged, ErrUnsupported, ErrNoUniqueKey, ErrTargetNotFound;
	// ErrPrivilege: a missing privilege, with the GRANT to run;
	// ErrSchemaBehind: the manifest needs "backfill migrate"; the login
	// refused; a pooler in statement mode): nothing was run, or, for an
	// error found once the run was under way (a throttle signal that
	// cannot be read), the run is marked failed with the reason as its
	// last_error; a manifest schema dropped while the run works
	// ([ErrSchemaMissing]) stops it, the chunks done kept in the target. Fix it; restarting cannot help (once fixed, running
	// the job again resumes the failed run).
	ExitUsage ExitCode = 64
	// ExitTempFail (75, EX_TEMPFAIL): the run is not finished and
	// restarting later resumes it: the context was cancelled (SIGTERM),
	// the database was unreachable for longer than the reconnect budget,
	// a fault or a lock wait outlasted its bound ([IsRetryable]),
	// chunks are open (they end after the horizon, see [ErrChunksOpen]),
	// chunks are still pending when this worker ended ([ErrRunIncomplete]),
	// the run was abandoned for a newer run of the job (restarting joins
	// it), or the run is paused ([ErrRunPaused]) and the manifest has no
	// control plane to wait on (with [PGManifest], Work waits while the
	// run is paused instead).
	ExitTempFail ExitCode = 75
	// ExitCancelled (3): an operator cancelled the run ([ErrRunCancelled],
	// [RunCancelled]): the chunks in flight rolled back. Do not restart:
	// a restart returns 3 again at once, until someone resumes the run
	// explicitly ([Runner.Resume], the SQL function resume) or starts a
	// new one ([Job.NewRun]).
	ExitCancelled ExitCode = 3
)

// Work runs job with r as one worker among any number, on any number of
// hosts, and returns its outcome as an exit code of the [ExitCode]
// contract (ExitDone 0, ExitFailed 1, ExitCancelled 3, ExitUsage 64, ExitTempFail 75); it logs the
// outcome (Config.Logger) with the code. Host programs call it and exit
// with its result:
//
//	os.Exit(int(backfill.Work(ctx, runner, job)))
//
// Workers started at once, or joining later, converge on one run: the
// first creates it, the others resume it (Job.NewRun must be false, or
// each would abandon the others' run), each claims chunks no other worker
// holds, and a worker that finds nothing to claim waits for the chunks
// other workers hold, fencing frozen ones ([Config.StaleAfter]), so that
// every worker returns once the run is completed (ExitDone) or failed
// (ExitFailed).
//
// A paused run (by an operator, a signal ([Runner.PauseOnSignal]), a
// throttle's critical level, a quality gate or the run reject gate,
// including one that failed on a chunk of this very call) does not end
// Work: it waits as a registered worker of the run (as [Runner.Run] does
// by default, but also on a pause of [Runner.PauseOnSignal], and whatever
// [Config.ReturnOnPause] says) and goes on once the run is resumed (SQL function resume, "backfill resume",
// [Runner.Resume]); a cancel ends it with ExitCancelled, ctx with
// ExitTempFail.
func Work(ctx context.Context, r *Runner, job Job) ExitCode {
	log := slog.New(slog.DiscardHandler)
	if r != nil {
		log = r.cfg.Logger
	}
	if r == nil {
		log.Error("backfill worker: no runner")
		return ExitUsage
	}
	rep, err := r.runTraced(ctx, job, waitAlways)
	code := exitCode(ctx, rep, err)
	attrs := []any{"job", job.Name, "batch_id", rep.BatchID, "exit_code", int(code), "status", rep.Status,
		"chunks_done", rep.ChunksDone, "chunks_total", rep.ChunksTotal, "chunks_run", rep.ChunksRun}
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	switch code {
	case ExitDone:
		log.Info("backfill worker: run completed", attrs...)
	case ExitTempFail:
		log.Warn("backfill worker: run not finished; restart later to resume it", attrs...)
	case ExitUsage:
		switch {
		case rep.Status == RunFailed:
			log.Error("backfill worker: bad job or configuration; the run is marked failed", attrs...)
		case errors.Is(err, ErrSchemaMissing) && chunksRun(rep, err) > 0:
			log.Error("backfill worker: the manifest schema went missing while the run worked: its record of the run is lost, the rows merged are kept in the target; "+
				"after backfill migrate, running the job again starts a new run, which merges every chunk again (replays change nothing)", attrs...)
		case chunksRun(rep, err) > 0:
			log.Error("backfill worker: bad job or configuration found while the run worked; it stopped, the chunks done are kept: fix it and restart to resume", attrs...)
		default:
			log.Error("backfill worker: bad job or configuration; nothing run", attrs...)
		}
	case ExitCancelled:
		log.Warn("backfill worker: run cancelled by an operator; do not restart until it is resumed", attrs...)
	case ExitFailed:
		if rep.BatchID == 0 {
			log.Error("backfill worker: failed before a run was created or resumed", attrs...)
		} else {
			log.Error("backfill worker: run failed; see last_error in the manifest", attrs...)
		}
	}
	return code
}

// chunksRun is the number of chunks this call completed: rep's, or the
// PartialError's when the report could not be read (a manifest schema
// dropped mid-run).
func chunksRun(rep Report, err error) int {
	var pe *PartialError
	if errors.As(err, &pe) {
		return max(rep.ChunksRun, pe.DoneCount)
	}
	return rep.ChunksRun
}

// isLoginRefused reports whether err is the server (or a pooler in front
// of it) refusing the login: a wrong password or user, no pg_hba entry
// (28000, 28P01; PgBouncer reports a refused server login as 08P01 with
// the server's message). Restarting cannot help.
func isLoginRefused(err error) bool {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case pe.Code.Class() == "28":
		return true
	case pe.Code == "08P01":
		m := strings.ToLower(pe.Message)
		return strings.Contains(m, "password authentication failed") || strings.Contains(m, "no pg_hba.conf entry") ||
			strings.Contains(m, "login failed") || strings.Contains(m, "does not exist")
	}
	return false
}

// exitCode maps the result of Run to the contract of [Work].
func exitCode(ctx context.Context, rep Report, err error) ExitCode {
	switch {
	case err == nil && rep.Status == RunCompleted:
		return ExitDone
	case err == nil && rep.Status == RunFailed:
		return ExitFailed
	case err == nil:
		// Running (others still work it, or it waits for a later call)
		// or paused.
		return ExitTempFail
	case errors.Is(err, ErrAlreadyCompleted):
		return ExitDone
	case errors.Is(err, ErrRunCancelled), rep.Status == RunCancelled:
		return ExitCancelled
	case errors.Is(err, ErrInvalidConfig), errors.Is(err, ErrInvalidScope), errors.Is(err, ErrPlanChanged),
		errors.Is(err, ErrUnsupported), errors.Is(err, ErrNoUniqueKey), errors.Is(err, ErrTargetNotFound),
		errors.Is(err, ErrPrivilege), errors.Is(err, ErrSchemaBehind), errors.Is(err, pgstore.ErrStatementPooler), isLoginRefused(err):
		return ExitUsage
	case rep.Status == RunFailed:
		return ExitFailed
	case errors.Is(err, ErrChunksOpen), errors.Is(err, ErrRunIncomplete), errors.Is(err, ErrRunPaused), errors.Is(err, ErrRunAbandoned),
		errors.Is(err, ErrAwaitingApproval), rep.Status == RunAwaitingApproval,
		rep.Status == RunPaused, ctx.Err() != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ExitTempFail
	case IsRetryable(err):
		// A fault or wait the library outlasted its bound on (connection
		// faults, lock waits on the manifest or the target): the run is
		// left as it was and a later start resumes it.
		return ExitTempFail
	}
	return ExitFailed
}
