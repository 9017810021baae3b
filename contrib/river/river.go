// Package backfillriver runs backfill jobs as River jobs: each chunk of a
// run is one River job, in River's queue in the same PostgreSQL database
// as the run's manifest and target.
//
// [Enqueue] plans a job and creates its run (backfill.Runner.StartRunTx)
// and inserts one River job per chunk left to load, in the caller's
// transaction: a crash leaves both or neither. A [Worker], added to the
// River client's workers, runs a River job's chunk with
// backfill.Runner.RunChunk and completes the River job
// (river.JobCompleteTx) inside the chunk's transaction, after its merge
// and checkpoint: the River job is completed if and only if the chunk is
// done, whether River or the manifest is asked.
//
// The library's lease and epoch fence every chunk's transaction, so a
// chunk is merged once even when River runs its job twice (a job rescued
// while its worker is still alive). See the README for which side decides
// retries, rescue, pause and cancel, and what River UI and "backfill
// status" show.
package backfillriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"

	"github.com/pgbackfill/backfill"
)

// Kind is the River job kind of a chunk ([ChunkArgs.Kind]).
const Kind = "backfill_chunk"

// ChunkArgs are the arguments of the River job that loads one chunk of a
// backfill run.
type ChunkArgs struct {
	// Job is the backfill job's name (backfill.Job.Name); the [Worker]
	// must know the job by this name.
	Job string `json:"job"`
	// BatchID is the run's batch ID.
	BatchID int64 `json:"batch_id"`
	// Seq is the chunk's Seq in the run's plan.
	Seq int `json:"seq"`
	// Chunk is the chunk's ID (its bounds), for River UI.
	Chunk string `json:"chunk"`
}

// Kind returns [Kind].
func (ChunkArgs) Kind() string { return Kind }

// EnqueueResult is what [Enqueue] did.
type EnqueueResult struct {
	// Run is the run created or continued, with its chunks.
	Run backfill.PlannedRun
	// Inserted counts the River jobs inserted; Skipped the chunks left
	// out because they are done, or because a River job of theirs
	// already waits, runs or completed (River's unique jobs, by args).
	Inserted, Skipped int
}

// Enqueue plans job with r and creates its run, or continues its run
// (same name and plan), and inserts a River job ([ChunkArgs]) for each of
// the run's chunks that is not done, all in tx: when tx commits, the run
// exists with its River jobs; when it rolls back, neither does. opts (nil
// for River's defaults and the worker's) sets the jobs' queue, priority,
// max attempts and tags; Enqueue makes the jobs unique by their
// arguments unless opts sets UniqueOpts, so that enqueueing a run again
// (to resume it after its River jobs were cancelled or discarded)
// inserts only the chunks left without a live River job.
//
// A run that is paused, cancelled or completed is returned as it is and
// gets no River jobs. Keep tx short: the run's creation holds a
// transaction lock on the job's name until tx ends.
func Enqueue(ctx context.Context, client *river.Client[*sql.Tx], tx *sql.Tx, r *backfill.Runner, job backfill.Job, opts *river.InsertOpts) (EnqueueResult, error) {
	pr, err := r.StartRunTx(ctx, tx, job)
	if err != nil {
		return EnqueueResult{}, err
	}
	res := EnqueueResult{Run: pr}
	if pr.Status != backfill.RunRunning {
		return res, nil
	}
	var o river.InsertOpts
	if opts != nil {
		o = *opts
	}
	if u := o.UniqueOpts; !u.ByArgs && !u.ByQueue && u.ByPeriod == 0 && len(u.ByState) == 0 {
		o.UniqueOpts = river.UniqueOpts{ByArgs: true}
	}
	var params []river.InsertManyParams
	for _, c := range pr.Chunks {
		if c.Status == backfill.ChunkDone {
			res.Skipped++
			continue
		}
		params = append(params, river.InsertManyParams{
			Args:       ChunkArgs{Job: job.Name, BatchID: pr.BatchID, Seq: c.Chunk.Seq, Chunk: c.Chunk.ID},
			InsertOpts: &o,
		})
	}
	if len(params) == 0 {
		return res, nil
	}
	ins, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return res, fmt.Errorf("backfillriver: job %q batch %d: insert River jobs: %w", job.Name, pr.BatchID, err)
	}
	for _, in := range ins {
		if in.UniqueSkippedAsDuplicate {
			res.Skipped++
		} else {
			res.Inserted++
		}
	}
	return res, nil
}

// Options tune a [Worker]; the zero value is the defaults.
type Options struct {
	// BusySnooze is how long a River job snoozes when another live
	// worker holds its chunk's lease (default 5s).
	BusySnooze time.Duration
	// PausedSnooze is how long a River job snoozes while its run is
	// paused (default 30s).
	PausedSnooze time.Duration
	// Timeout is the River job's timeout (River's Worker.Timeout): 0
	// keeps the client's JobTimeout (River's default is one minute),
	// -1 sets none. A chunk whose timeout passes rolls back and River
	// retries it. River rescues a stuck job (its worker died) only when
	// it has a timeout, once RescueStuckJobsAfter (not less than the
	// timeout) has passed: with -1 a dead worker's job stays running.
	Timeout time.Duration
}

// Worker is the River worker of [ChunkArgs]: add it to the client's
// workers with river.AddWorker. It runs each River job's chunk with
// its Runner and completes the River job in the chunk's transaction.
type Worker struct {
	river.WorkerDefaults[ChunkArgs]
	r    *backfill.Runner
	jobs map[string]backfill.Job
	opts Options
	// beforeCommit, when set (tests), runs in the chunk's transaction
	// before the River job is completed.
	beforeCommit func(ctx context.Context, args ChunkArgs) error
}

// NewWorker returns the worker of the River jobs of jobs, which it runs
// with r. A River job whose job name is not among jobs is cancelled.
// opts may be nil.
func NewWorker(r *backfill.Runner, opts *Options, jobs ...backfill.Job) (*Worker, error) {
	if r == nil {
		return nil, errors.New("backfillriver: NewWorker: no Runner")
	}
	w := &Worker{r: r, jobs: map[string]backfill.Job{}}
	if opts != nil {
		w.opts = *opts
	}
	if w.opts.BusySnooze <= 0 {
		w.opts.BusySnooze = 5 * time.Second
	}
	if w.opts.PausedSnooze <= 0 {
		w.opts.PausedSnooze = 30 * time.Second
	}
	for _, j := range jobs {
		if _, dup := w.jobs[j.Name]; dup {
			return nil, fmt.Errorf("backfillriver: NewWorker: two jobs named %q", j.Name)
		}
		w.jobs[j.Name] = j
	}
	return w, nil
}

// Timeout returns [Options.Timeout].
func (w *Worker) Timeout(*river.Job[ChunkArgs]) time.Duration { return w.opts.Timeout }

// output is what a River job records as its output (River UI shows it).
type output struct {
	Outcome      backfill.ChunkOutcome `json:"outcome"`
	RunStatus    backfill.RunStatus    `json:"run_status,omitempty"`
	Read         int64                 `json:"read"`
	Inserted     int64                 `json:"inserted"`
	Updated      int64                 `json:"updated"`
	Unchanged    int64                 `json:"unchanged"`
	Rejected     int64                 `json:"rejected"`
	Deduplicated int64                 `json:"deduplicated"`
}

// Work runs the chunk of River job rj with backfill.Runner.RunChunk. The
// chunk's outcome decides the River job's:
//
//   - loaded: the River job was completed in the chunk's transaction;
//   - already done (an earlier attempt, or another worker, committed
//     it): completed, nothing loaded;
//   - held by another live worker: snoozed (Options.BusySnooze);
//   - its run paused: snoozed (Options.PausedSnooze);
//   - its run cancelled, failed, abandoned or rolled back: cancelled;
//   - the attempt failed: an error River retries, unless the failure is
//     final (not retryable, or River's last attempt), which fails the run
//     and cancels the River job.
func (w *Worker) Work(ctx context.Context, rj *river.Job[ChunkArgs]) error {
	args := rj.Args
	job, ok := w.jobs[args.Job]
	if !ok {
		return river.JobCancel(fmt.Errorf("backfillriver: this worker knows no backfill job named %q", args.Job))
	}
	rep, err := w.r.RunChunk(ctx, job, backfill.ChunkCall{
		BatchID: args.BatchID,
		Seq:     args.Seq,
		Final:   rj.Attempt >= rj.MaxAttempts,
		BeforeCommit: func(ctx context.Context, tx *sql.Tx, res backfill.ChunkResult) error {
			if w.beforeCommit != nil {
				if err := w.beforeCommit(ctx, args); err != nil {
					return err
				}
			}
			if err := river.RecordOutput(ctx, output{Outcome: backfill.ChunkLoaded, Read: res.Read, Inserted: res.Inserted, Updated: res.Updated,
				Unchanged: res.Unchanged, Rejected: res.Rejected, Deduplicated: res.Deduplicated}); err != nil {
				return err
			}
			_, err := river.JobCompleteTx[*riverdatabasesql.Driver](ctx, tx, rj)
			return err
		},
	})
	switch rep.Outcome {
	case backfill.ChunkLoaded:
		return nil
	case backfill.ChunkAlreadyDone:
		_ = river.RecordOutput(ctx, output{Outcome: rep.Outcome, RunStatus: rep.RunStatus})
		return nil
	case backfill.ChunkBusy:
		return river.JobSnooze(w.opts.BusySnooze)
	case backfill.ChunkRunPaused:
		return river.JobSnooze(w.opts.PausedSnooze)
	case backfill.ChunkRunEnded:
		return river.JobCancel(fmt.Errorf("backfillriver: job %q batch %d is %s: chunk %d %s not loaded: %s", args.Job, args.BatchID, rep.RunStatus, args.Seq, args.Chunk, rep.Reason))
	case backfill.ChunkAttemptFailed:
		if rep.Final {
			return river.JobCancel(fmt.Errorf("backfillriver: chunk %d %s failed for good (the run is %s): %w", args.Seq, args.Chunk, rep.RunStatus, err))
		}
	}
	if err == nil {
		err = fmt.Errorf("backfillriver: chunk %d %s: unexpected outcome %q", args.Seq, args.Chunk, rep.Outcome)
	}
	if errors.Is(err, backfill.ErrPlanChanged) || errors.Is(err, backfill.ErrInvalidConfig) || errors.Is(err, backfill.ErrUnsupported) {
		// The worker's job is not the run's: retrying cannot help.
		return river.JobCancel(err)
	}
	return err
}
