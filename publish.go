package backfill

import (
	"context"
	"fmt"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PublishMode says when a run's rows become visible to readers.
type PublishMode string

const (
	// PublishPerChunk (the default, "") makes each chunk visible when its
	// transaction commits.
	PublishPerChunk PublishMode = ""
	// PublishVersionedView loads the run into a new version of the target
	// table, invisible to readers who query [Publish.View], and switches
	// the view to it in one transaction when every chunk is done: readers
	// see the old version or the new one, never a mix. The previous
	// version is kept; [Runner.Rollback] switches the view back to it, or,
	// for a batch not yet published, makes sure it never is. A scope that
	// ends after now (or the watermark) is refused with [ErrInvalidScope]:
	// its open chunks would keep the run from completing, so from being
	// published. Versions are named "<table>__v<batch>", shortened with a
	// hash when longer than PostgreSQL's 63 bytes.
	PublishVersionedView PublishMode = "versioned_view"
)

// Publish configures how a job's rows reach readers ([Job.Publish]).
type Publish struct {
	// Mode is the publish mode; the zero value publishes per chunk.
	//
	// With PublishVersionedView the table of record becomes the version
	// the view reads: after the first publish, write to that version (or
	// through the backfill), not to the base table, whose later edits no
	// version copies.
	Mode PublishMode
	// View is the view readers query, optionally schema-qualified, in the
	// form of [backfilltype.Target.Table] (PublishVersionedView). It is
	// created on the first publish.
	View string
	// LockTimeout bounds the wait for the parent's lock when swapping a
	// partition (PublishPartitionSwap), as a PostgreSQL interval; on
	// timeout the chunk is retried (55P03 is retryable); default "5s".
	// It also bounds each try of the view switch of PublishVersionedView,
	// which waits for readers' transactions on the view while new readers
	// of the view queue behind it; default "200ms" there, so that they
	// wait at most that long.
	LockTimeout string
	// LockRetries is how many times the view switch of
	// PublishVersionedView is tried when LockTimeout expires, pausing
	// 100ms, 200ms, ... (at most 5s) in between; new readers read the old
	// version meanwhile. After the last try the run returns an error
	// wrapping [ErrPublishBlocked] naming the blocking sessions. 0 means
	// [DefaultPublishLockRetries].
	LockRetries int
}

// DefaultPublishLockRetries is the default of [Publish.LockRetries].
const DefaultPublishLockRetries = 10

// String returns the publish mode as the run's plan records it (the
// plan's Publish field, part of its fingerprint): "" for
// [PublishPerChunk], otherwise the mode and the view joined by a colon
// ("versioned_view:sales.orders_current"; "at_end:" and
// "partition_swap:" with no view). LockTimeout and LockRetries are not
// part of it.
func (p Publish) String() string {
	if p.Mode == PublishPerChunk {
		return ""
	}
	return string(p.Mode) + ":" + p.View
}

// validate checks p for job, whose ChunkColumn is chunkColumn; it names
// the bad field.
func (p Publish) validate(job, chunkColumn string) error {
	switch p.Mode {
	case PublishPerChunk:
		return nil
	case PublishVersionedView:
		if p.View == "" {
			return fmt.Errorf("%w: Job.Publish.View is required with PublishVersionedView (job %q)", ErrInvalidConfig, job)
		}
		if _, _, err := sqlgen.ParseTable(p.View); err != nil {
			return fmt.Errorf("%w: Job.Publish.View: %w (job %q)", ErrInvalidConfig, err, job)
		}
		return nil
	case PublishPartitionSwap:
		if chunkColumn == "" {
			return fmt.Errorf("%w: PublishPartitionSwap needs Job.ChunkColumn, the partition key (job %q)", ErrInvalidConfig, job)
		}
		return nil
	case PublishAtEnd:
		return nil
	}
	return fmt.Errorf("%w: Job.Publish.Mode %q is not supported (job %q)", ErrInvalidConfig, p.Mode, job)
}

// publisher is how a publish mode makes a run's rows visible: one
// implementation per mode (backfill_publish_*.go), chosen once per call
// by publisherFor. The Runner calls its hooks in this order: requires
// before any work; prepare once per call that works on the run; target
// and beforeCommit in every chunk's transaction; finish when the call's
// chunks are done; published after the run is finished; rollback from
// [Runner.Rollback]. Hooks get the execution (or Runner) and use only
// its resolved capabilities; none is called concurrently with prepare,
// finish or published, while target and beforeCommit run in as many
// chunks at once as [Config.Concurrency].
type publisher interface {
	// requires returns an error wrapping [ErrUnsupported] naming the
	// capability the mode needs and c lacks.
	requires(c capabilities) error
	// rereads reports whether a loaded chunk can be read again: a
	// mode that cannot refuses scopes that end after the horizon.
	rereads() bool
	// publishesOpen reports whether a run with open chunks (ending after
	// the horizon) gets published; a mode that does not refuses such
	// scopes.
	publishesOpen() bool
	// switchesBack reports whether a run is rolled back by switching
	// back to what it replaced ([RollbackSwitchBack]), not by an undo log.
	switchesBack() bool
	// prepare readies the run before its first chunk of this call (it may
	// change ex.info, the table merged into).
	prepare(ctx context.Context, ex *execution) error
	// target returns chunk c's target in tx: where it merges, and how it
	// stages.
	target(ctx context.Context, ex *execution, tx backfilldriver.Tx, c Chunk) (chunkTarget, error)
	// beforeCommit checkpoints the chunk in tx, after its merge and
	// validation, with the chunk's exceptions; the commit follows.
	beforeCommit(ctx context.Context, ex *execution, tx backfilldriver.Tx, t chunkTarget, res ChunkResult, exceptions []Exception) error
	// finish runs when every chunk of the call is checkpointed and none
	// failed; it records failures with ex.fail.
	finish(ctx context.Context, ex *execution)
	// published runs after the run is finished; it reports whether it
	// made the run visible now.
	published(ctx context.Context, ex *execution, run Run) (bool, error)
	// rollback rolls run (planned with this mode) back by switching back;
	// handled is false when the mode leaves it to the undo log.
	rollback(ctx context.Context, r *Runner, job Job, run Run, plan Plan, opts RollbackOptions) (rep RollbackReport, handled bool, err error)
}

// chunkTarget is where and how one chunk is loaded (publisher.target).
type chunkTarget struct {
	// info is the table merged into, with the chunk's ChunkRef.
	info TableInfo
	// newStager makes the chunk's stager in its transaction; isolate
	// says whether it stages with COPY in that transaction, so that
	// refused values can be isolated by savepoint ([chunkStaging]).
	newStager func() (backfilldriver.Stager, error)
	isolate   bool
	// deferred: the chunk's rows are only staged; the run's publish
	// merges, validates and completes it (PublishAtEnd).
	deferred bool
	// staged returns how many rows a deferred chunk staged.
	staged func() int64
	// part and keyType are the partition the chunk's table replaces and
	// its key type (PublishPartitionSwap).
	part, keyType string
}

// publisherFor returns the publisher of p.Mode, which p.validate accepted.
func publisherFor(p Publish) publisher {
	switch p.Mode {
	case PublishVersionedView:
		return publishView{}
	case PublishPartitionSwap:
		return publishSwap{}
	case PublishAtEnd:
		return publishEnd{}
	}
	return publishChunk{}
}
