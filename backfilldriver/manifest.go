package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Manifest is the durable ledger of runs, chunks and the exception queue.
//
// Every method takes the executor to use: the Runner passes the chunk's
// transaction to CompleteChunk (after [ManifestLeases.FenceLease], which
// every Manifest of a Runner must implement) so that the checkpoint
// commits, or rolls back, with the merge. Implementations must be safe for
// concurrent use by several goroutines and several processes.
// backfill.PGManifest is the PostgreSQL implementation;
// backfilltest.Manifest the in-memory fake; backfilltest.TestManifest the
// conformance suite.
type Manifest interface {
	// Init creates or upgrades the manifest's storage. Idempotent and safe
	// to call concurrently.
	Init(ctx context.Context, db sqlx.ExtContext) error
	// StartRun finds the run of plan.Job to continue or creates a new one.
	// An incomplete (running or failed) run with the same fingerprint is
	// resumed (its failed and open chunks become pending again) and resumed
	// is true. A completed run with the same fingerprint is returned as it
	// is, resumed true, unless newRun. An incomplete run with another
	// fingerprint gives [backfilltype.ErrPlanChanged] naming the changed
	// fields, unless newRun, which marks it abandoned and creates a new
	// run.
	StartRun(ctx context.Context, db sqlx.ExtContext, plan backfilltype.Plan, worker string, newRun bool) (run backfilltype.Run, resumed bool, err error)
	// ClaimChunk locks the lowest-Seq pending chunk of the batch (or open
	// chunk left open by an earlier call of the run, see
	// [backfilltype.ChunkOpen]) that no other transaction holds (FOR UPDATE
	// SKIP LOCKED) and returns it; ok is false when none is left or the run
	// is not running (abandoned, completed, failed, paused): a worker of an
	// abandoned run stops. The run's row is not locked: the run may change
	// status while a claimed chunk is in flight; the checkpoint
	// (CompleteChunk) refuses a chunk of a run abandoned or rolled back
	// meanwhile, and whoever abandons or rolls back a run waits for its
	// chunks in flight. The lock lasts until tx ends: it is the chunk's
	// lease, released by commit, rollback or the death of the connection,
	// so a crashed worker never blocks a resume. (The Runner leases chunks
	// instead, [ManifestLeases.LeaseChunk]; a fenced chunk is not claimable
	// either.)
	ClaimChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64) (c backfilltype.ChunkState, ok bool, err error)
	// CompleteChunk marks a claimed chunk done (or [backfilltype.ChunkOpen]
	// when r.Open) with its counts and whether it was skipped (r.Skipped,
	// then [backfilltype.ChunkState.Skipped]) and appends its exceptions,
	// in tx. A chunk read before and still open replaces its exceptions
	// with these and combines its counts with r's by
	// [backfilltype.Counts.Reread], in tx. It returns an error wrapping
	// [backfilltype.ErrAccounting] if r does not balance.
	CompleteChunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, r backfilltype.ChunkResult, exceptions []backfilltype.Exception) error
	// FailChunk records a failed attempt outside the chunk's (rolled back)
	// transaction; final marks the chunk failed, otherwise it stays pending.
	// An open chunk stays open (it holds rows of its earlier reads).
	FailChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, msg string, final bool) error
	// FinishRun sets the run's status to completed when every chunk is done
	// (an open chunk is not), or to failed with msg when failed is true;
	// otherwise it leaves the run running. It returns the resulting run.
	FinishRun(ctx context.Context, db sqlx.ExtContext, batchID int64, failed bool, msg string) (backfilltype.Run, error)
	// Chunks returns the batch's chunks in Seq order.
	Chunks(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.ChunkState, error)
	// Exceptions returns the batch's exception queue in (chunk Seq, Row) order.
	Exceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Exception, error)
}

// ManifestAudit is implemented by manifests that keep an audit log and look
// runs up by job name; backfill.PGManifest and backfilltest.Manifest do.
// Features that record operator decisions (backfill.Runner.Handoff) need it
// and return [backfilltype.ErrUnsupported] without it.
type ManifestAudit interface {
	// RecordEvent appends e (ID and CreatedAt are set by the manifest). It
	// joins db's transaction when db is one.
	RecordEvent(ctx context.Context, db sqlx.ExtContext, e backfilltype.Event) error
	// Events returns the events of batchID in order.
	Events(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Event, error)
	// LatestRun returns the newest run of job with one of the statuses
	// (any status when none is given), or [backfilltype.ErrRunNotFound].
	LatestRun(ctx context.Context, db sqlx.ExtContext, job string, statuses ...backfilltype.RunStatus) (backfilltype.Run, error)
}
