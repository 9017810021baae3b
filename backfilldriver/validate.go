package backfilldriver

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ValidationScope is what a [Validator] checks: one chunk of a run, after
// its merge and before its checkpoint, inside its transaction.
type ValidationScope struct {
	// BatchID is the run's batch ID.
	BatchID int64
	// Chunk is the chunk just merged.
	Chunk backfilltype.Chunk
	// Info is the prepared target.
	Info backfilltype.TableInfo
	// ChunkColumn and Zone are the job's (backfill.Job.ChunkColumn,
	// backfill.Job.Zone): they bound "the chunk's rows" in the target for
	// checks that need it.
	ChunkColumn string
	Zone        *time.Location
	// Counts are the chunk's row counts so far (read, inserted, ...).
	Counts backfilltype.Counts
	// Staging is the quoted name of the chunk's staging table, holding the
	// rows that were merged (after deduplication and rejections), or ""
	// when the merger has none (the fakes).
	Staging string
	// Stager is the chunk's stager; it implements [Replayer] when the
	// merger can re-run its merge (the PostgreSQL merger's does).
	Stager Stager
}

// Validator checks one chunk. The built-ins for PostgreSQL are those of
// package backfill (Completeness, Aggregates, ...). Validators run in
// backfill.Job.Validators order, in the chunk's transaction: they must not
// write to the target (a replay check writes inside a savepoint and rolls
// it back).
type Validator interface {
	// Validate checks scope inside tx and returns its evidence. An error
	// means the check could not run (not that it failed); the chunk then
	// fails like any other error.
	Validate(ctx context.Context, tx sqlx.ExtContext, scope ValidationScope) (backfilltype.CheckResult, error)
}

// Replayer is implemented by stagers that can run their merge again on
// the same staged rows, for the replay-changes-nothing check. Replay must
// leave no trace: it runs inside a savepoint it rolls back, and returns
// what the merge would have done.
type Replayer interface {
	// Replay returns the counts the merge would give if run again on the
	// staged rows now (after a correct merge every count but Unchanged is
	// 0), leaving the target as it was; an error means the replay could
	// not run.
	Replay(ctx context.Context) (backfilltype.MergeResult, error)
}

// StagingTabler is implemented by stagers whose rows live in a table
// (the PostgreSQL merger's): it returns the quoted table name.
type StagingTabler interface {
	// StagingTable returns the staging table's name, quoted and
	// schema-qualified as needed to be used in SQL as it is.
	StagingTable() string
}

// ManifestValidations is implemented by manifests that keep validation
// Evidence and can pause runs; backfill.PGManifest and
// backfilltest.Manifest do. backfill.Job.Validators need it
// ([backfilltype.ErrUnsupported] otherwise).
type ManifestValidations interface {
	// AddValidations appends results for a chunk, joining db's
	// transaction when db is one.
	AddValidations(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, results []backfilltype.CheckResult) error
	// Validations returns the batch's results in the order recorded.
	Validations(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]backfilltype.Validation, error)
	// PauseRun sets a running run to paused with the reason; claims stop.
	PauseRun(ctx context.Context, db sqlx.ExtContext, batchID int64, reason string) error
	// ResumeRun sets a paused run to running, recording who and why in the
	// audit log; it returns [backfilltype.ErrNotPaused] when the run is not
	// paused.
	ResumeRun(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error
}
