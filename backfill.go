package backfill

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltrace"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Mode says how a [Target] identifies records and what a merge does with a
// staged row whose business key is already present. Decide identity before
// the upsert strategy: the mode is part of the plan.
type Mode = backfilltype.Mode

const (
	// Upsert is for mutable master data: a staged row whose business key
	// exists replaces the target row when any non-key column differs
	// (IS DISTINCT FROM, NULL-safe) and is left alone otherwise; absent
	// keys are inserted. [backfilltype.Target.Conflict] decides who wins a
	// disagreement. It is the default.
	Upsert = backfilltype.Upsert
	// AppendOnly is for immutable events with a unique event ID (the Key).
	// A replayed event resolves to the existing row and writes nothing. An
	// event whose ID exists with different content is neither overwritten
	// nor dropped: it goes to the exception queue with the differing
	// columns named (reason "conflicting content for existing event: ...").
	// Inside one chunk, the first row of an ID wins; later identical rows
	// are deduplicated and later different rows are rejected the same way.
	// Between chunks (of one run, or of runs in parallel) that carry one
	// ID with different content, the chunk whose transaction commits
	// first wins and the others queue their row: which one that is
	// depends on commit order, so at Concurrency > 1 it can differ from
	// run to run (the queued loser says which).
	AppendOnly = backfilltype.AppendOnly
	// History is versioned history (SCD type 2). Each version is a row
	// keyed by Key plus [backfilltype.Target.ValidFrom];
	// [backfilltype.Target.ValidTo] holds the exclusive end of its
	// half-open interval [valid_from, valid_to), NULL for the current
	// version (an open end, never a sentinel date). The extractor writes
	// versions with their valid_from; the merge keeps every version the
	// source asserted at a distinct valid_from, inserts late versions at
	// their place (splitting the interval they fall into) and recomputes
	// valid_to for the keys it touched, so intervals per key tile its
	// history with no overlap and no gap. A version whose (key, valid_from)
	// exists is unchanged when its columns are identical (NULL-safe) and
	// corrects the version in place otherwise. Versions equal to their
	// predecessor are kept, not collapsed: collapsing would discard what
	// the source said and make the result depend on arrival order.
	History = backfilltype.History
	// Keyless is for legacy sources without a good key: the Key columns
	// are derived by [backfilltype.Target.Derive] rules (trim, case fold,
	// Unicode NFC, whitespace collapse, ...) from source columns. Rows
	// whose derived keys collide with different content, inside a chunk or
	// with the target, all go to the exception queue (reason "ambiguous
	// derived key"); identical rows are deduplicated.
	Keyless = backfilltype.Keyless
)

// ConflictPolicy decides, in [Upsert] mode, which side wins when a staged
// row and the target row of the same business key differ.
type ConflictPolicy = backfilltype.ConflictPolicy

const (
	// SourceWins always takes the staged row. It is the default. Order
	// dependent when the same key appears in several chunks (of one run,
	// or of runs in parallel) with different content: the chunk whose
	// transaction commits last wins. At Concurrency 1 that is the chunk
	// planned last; above it, whichever finishes last, which can differ
	// from run to run. Use a [backfilltype.Target.Version] with
	// NewerVersionWins for a result independent of order and concurrency.
	SourceWins = backfilltype.SourceWins
	// TargetWins inserts missing keys only; differing existing rows are
	// kept and counted as unchanged. Order dependent when the same key,
	// absent from the target, appears in several chunks with different
	// content: the chunk whose transaction commits first inserts it and
	// wins, the others find it and leave it (counted unchanged, not
	// queued). At Concurrency 1 that is the chunk planned first; above it,
	// whichever commits first, which can differ from run to run. Use a
	// [backfilltype.Target.Version] with NewerVersionWins for a result
	// independent of order and concurrency.
	TargetWins = backfilltype.TargetWins
	// NewerVersionWins takes the row with the greater
	// [backfilltype.Target.Version] value (NULL is older than any value).
	// Ties with different content are broken by the greater text form of
	// the non-key columns, so the final state is the same whatever the
	// arrival order of versions. Inside a chunk the same rule picks the
	// surviving row.
	NewerVersionWins = backfilltype.NewerVersionWins
)

// DuplicatePolicy is the deterministic rule for business keys that occur
// more than once in one chunk ([Upsert] with SourceWins or TargetWins, and
// [History] per (key, valid_from)).
type DuplicatePolicy = backfilltype.DuplicatePolicy

const (
	// KeepLast keeps, per business key, the row written last by the
	// extractor (highest row number) and counts the others as deduplicated.
	// It is the default. Deterministic as long as the extractor writes a
	// chunk's rows in a deterministic order.
	KeepLast = backfilltype.KeepLast
	// KeepFirst keeps the row written first and counts the others as
	// deduplicated.
	KeepFirst = backfilltype.KeepFirst
)

// Target describes the table a job writes to and how records are
// identified in it: which columns identify a record (Key), which may
// change (the other Columns), and which side wins a disagreement (Mode,
// Conflict).
type Target = backfilltype.Target

// Lineage configures the lineage columns of a [Target]: which batch
// inserted a row and which batch last changed it. They are written on
// every insert and update, never compared (a replay does not touch them),
// and they let a rollback refuse to undo rows that a later batch changed.
// Ingestion time is [backfilltype.Target.IngestedAt].
type Lineage = backfilltype.Lineage

// RollbackMechanism is how a job's batches can be withdrawn, chosen before
// writing and recorded in the plan ([Job.Rollback]).
type RollbackMechanism = backfilltype.RollbackMechanism

const (
	// RollbackUndoLog keeps, in the chunk's transaction, the prior image of
	// every row a batch updated (and the SCD2 intervals it closed), and
	// finds the rows it inserted by lineage; [Runner.Rollback] restores
	// them. It needs the Lineage UpdatedBy and InsertedBy columns. The
	// default when the target has them.
	RollbackUndoLog = backfilltype.RollbackUndoLog
	// RollbackNone explicitly accepts that batches cannot be withdrawn.
	RollbackNone = backfilltype.RollbackNone
	// RollbackSwitchBack withdraws a batch published by a versioned view or
	// partition swaps by pointing readers back to the versions it
	// replaced, which are kept. The default of those publish modes.
	RollbackSwitchBack = backfilltype.RollbackSwitchBack
)

// Job is one backfill: what to read (Chunker + Extractor), where to write
// (Target) and the lineage to record. A Job is frozen into a plan when a run
// starts; running a Job of the same Name again resumes that plan.
type Job struct {
	// Name identifies the job. The same Name with the same plan resumes
	// the latest incomplete run. Required.
	Name string
	// Source names the source system, recorded in the manifest as lineage.
	Source string
	// CodeVersion is the version of the transformation code (a commit
	// hash, a release tag). It is part of the plan fingerprint.
	CodeVersion string
	// Chunker splits the scope into chunks. Required.
	Chunker Chunker
	// Extractor reads one chunk from the source. Required.
	Extractor Extractor
	// Target is the table to merge into. Required.
	Target Target
	// NewRun starts a new run (a new batch ID) even if an incomplete run
	// of the same Name exists; that run is marked abandoned. Without it a
	// changed plan is refused with [ErrPlanChanged], and a completed plan
	// is not run again.
	NewRun bool

	// ChunkColumn names the written column that carries each row's value
	// of the chunking dimension (a time, an integer key, or a list item
	// such as a tenant). When set, the runner rejects every row whose
	// value lies outside its chunk's half-open interval [start, end) with
	// reason "outside chunk" — catching extractors that use BETWEEN, <=
	// end or an end-of-day 23:59:59.999. Empty disables the check.
	ChunkColumn string
	// Zone is the IANA location of the job's wall clocks, never the
	// session's or the machine's zone. A time.Time written to a timestamp
	// without time zone column is an instant: its wall clock in Zone is
	// stored, whatever wrapper delivers it (a *time.Time, sql.NullTime,
	// sql.Null[time.Time], a named time type, a driver.Valuer returning a
	// time.Time). Text written to such a column is a wall clock read in Zone
	// (for the ChunkColumn check). A date is the civil date of the value as
	// given; as ChunkColumn it means its midnight in Zone. Default
	// time.UTC. Recorded in the plan.
	Zone *time.Location
	// DateMeaning says what a date-only value of the source means; it is
	// recorded in the plan (and so in the manifest) for the people who
	// read the data later. Default DateUnspecified.
	DateMeaning DateMeaning
	// Validators check every chunk after its merge, before its checkpoint,
	// in its transaction; their evidence goes to the manifest. A failed
	// check of [SeverityError] is a quality gate: the chunk rolls back and
	// the run pauses until [Runner.Resume] (or [Runner.AcceptGate], which
	// accepts the failure for that chunk); the failed attempt's evidence is
	// kept (see [backfilldriver.ManifestGates]). Validators are not part of
	// the plan: changing them between calls of a run does not refuse it,
	// but each change is an audit event
	// ([backfilltype.EventValidatorsChanged]) and a report warning. The
	// PostgreSQL checks are [DuplicateKeys], [Completeness],
	// [ReferentialIntegrity], [Aggregates], [ReplayChangesNothing],
	// [Sample] and [CheckExceptionRate].
	Validators []Validator
	// Publish says when rows become visible to readers; the zero value
	// publishes each chunk as it commits. See [PublishVersionedView].
	Publish Publish
	// Rollback is the rollback mechanism. Empty means RollbackUndoLog when
	// the target has lineage columns; without them the job must say
	// RollbackNone explicitly ([ErrInvalidConfig] otherwise), so that no
	// backfill runs without a decided way back.
	Rollback RollbackMechanism
	// MaxRunRejectRate is a quality gate on the whole run, on by default:
	// when the rejected rows of the run's completed chunks exceed this
	// fraction of their read rows (0.01 = 1%), checked after each chunk,
	// the run pauses like on a failed [SeverityError] check, until
	// [Runner.Resume]; Run returns an error wrapping [ErrGateFailed] (not a
	// [*ChunkError]: the chunk after which it paused is done). A resume
	// accepts the rejects so far: whether from SQL (the function resume),
	// the CLI ("backfill resume"), [Runner.Resume] or [Runner.AcceptGate],
	// it records the run's rows read and rejected at that point (in the
	// detail of its "run_resumed_by_operator" event, and in a
	// [backfilltype.EventGateBaseline] event), and the gate then judges
	// only the rows read after the resume: the run pauses again only when
	// those cross the rate. 0 means [DefaultMaxRunRejectRate] (10%); a
	// negative value disables the gate. Whatever the gate, a run whose
	// chunks rejected every row they read (none loaded, at least one read)
	// never completes silently: when the call that ran its last chunks ends
	// (open chunks included), the run pauses the same way ("no row loaded";
	// after a resume, of the rows read since). The per-chunk rate is
	// [CheckExceptionRate].
	MaxRunRejectRate float64
	// Watermark, if set, is asked for the source's high-water mark at
	// each call of [Runner.Run]; the manifest records the one taken when
	// the run is created, and [Runner.Handoff] rescans from it. A time
	// chunk whose end lies after the watermark (or after the time it is
	// read, with or without a watermark) is loaded but left [ChunkOpen]
	// and read again by the next call: the run completes only once every
	// chunk has ended before the horizon. See [SafetyLag] and
	// [PGSourceWatermark].
	Watermark Watermarker
	// SkipUnchanged lets a replay (a [Job.NewRun] over a loaded range, or
	// a restatement in which few chunks changed) skip the staging and
	// merge of a chunk whose rows did not change since its last load (its
	// base: the newest done chunk of the same job, chunk ID and skip key,
	// in a batch not rolled back). Every chunk is still extracted (unless
	// a [ChunkVersioner] spares it); it is skipped when the multiset hashes
	// of its rows and of its target rows (within its ChunkColumn bounds,
	// else of its identities) equal the base's, wrongly only with a
	// probability of about 2^-64. With a ChunkColumn, a chunk whose base
	// recorded the hash of its values as written is first extracted
	// through a writer that only hashes them; a chunk found changed is
	// then extracted a second time to be staged and merged (the extractor
	// runs twice for it: it must be repeatable, as for any retry), and a
	// call stops probing once most of its probes found their chunk
	// changed. Other chunks are extracted once, into a spool. A skipped chunk
	// writes no target row, lineage or undo entry, counts its rows as read,
	// rejected or unchanged, sets [backfilltype.ChunkResult.Skipped], and its
	// staging-versus-target validators pass, proven by the fingerprints.
	// The skip key covers the plan without its scope and chunk list, and
	// the target's column types.
	//
	// Eligible jobs only: Target.Mode [Upsert] or [AppendOnly], Conflict
	// [SourceWins] and no Version, [PublishPerChunk], a fingerprint for
	// every target column, no written reg* column, and validators the
	// fingerprints prove.
	//
	// On by default for an eligible job with a [Job.ChunkColumn] run by a
	// Runner that can skip (the default manifest and merger): a first
	// load records the fingerprints (a few percent of its time), and a
	// replay skips. Without ChunkColumn a skip finds the chunk's target
	// rows by their keys, one index probe per row, which costs about what
	// a merge that finds them unchanged does: such a job skips only when
	// it sets SkipUnchanged. A job that is not eligible, one without
	// ChunkColumn, or a Runner whose Manifest lacks
	// [backfilldriver.ManifestSkips] or whose Merger is not the
	// PostgreSQL merger, merges every chunk and logs why, once per Runner
	// and job, at Info level. Setting SkipUnchanged requires skipping: [Runner.Run]
	// then refuses an ineligible job before any work with an error
	// wrapping [ErrInvalidConfig], and a Runner that cannot skip with
	// [ErrUnsupported]. [Job.MergeEveryChunk] turns it off; setting both is
	// ErrInvalidConfig. Neither is part of the plan: changing them between
	// calls does not refuse the run. The README ("Replays that skip
	// unchanged chunks") says what is hashed; the design note
	// docs/design/skip-unchanged.md why.
	SkipUnchanged bool
	// MergeEveryChunk turns off the default skipping of unchanged chunks
	// ([Job.SkipUnchanged]): every chunk is staged and merged, and no
	// fingerprint is recorded (nor hashed). False by default.
	MergeEveryChunk bool
	// Approval, with Approvers > 0, makes each new run of the job start
	// [RunAwaitingApproval]: nothing is leased or written until
	// Approvers approvals of the run's plan fingerprint are recorded
	// ([Runner.Approve], the SQL function approve, "backfill approve").
	// It is part of the plan. The zero value needs no approval. Needs
	// [PGManifest] ([ErrUnsupported] otherwise).
	Approval ApprovalPolicy
}

// DefaultMaxRunRejectRate is the default of [Job.MaxRunRejectRate]: a
// run pauses when more than 10% of the rows it read were rejected.
const DefaultMaxRunRejectRate = 0.10

// DateMeaning says what a date without a time means in a source.
type DateMeaning = backfilltype.DateMeaning

const (
	// DateUnspecified: the job declared nothing (no date-only values, or
	// their meaning is not known).
	DateUnspecified = backfilltype.DateUnspecified
	// DateLocalCalendarDay: the local calendar day in [Job.Zone].
	DateLocalCalendarDay = backfilltype.DateLocalCalendarDay
	// DateAccountingPeriod: a business period identifier (the day an
	// entry was booked to), not an instant.
	DateAccountingPeriod = backfilltype.DateAccountingPeriod
	// DateProcessingDate: the day the source processed the record.
	DateProcessingDate = backfilltype.DateProcessingDate
)

// Extractor reads the source for one chunk. It is the part of a backfill
// that host applications write.
type Extractor interface {
	// Extract streams the rows of chunk c into w. It must read exactly the
	// half-open interval c describes, in a deterministic order, and may
	// call w.Reject for rows it cannot convert. Extract runs inside the
	// chunk's transaction; it may be called again for the same chunk after
	// a failure (never after the chunk completed). It must honour ctx.
	Extract(ctx context.Context, c Chunk, w RowWriter) error
}

// ExtractorFunc adapts a function to [Extractor].
type ExtractorFunc func(ctx context.Context, c Chunk, w RowWriter) error

// Extract calls f(ctx, c, w).
func (f ExtractorFunc) Extract(ctx context.Context, c Chunk, w RowWriter) error { return f(ctx, c, w) }

// RowWriter receives the rows of one chunk from an [Extractor]. It is not
// safe for concurrent use and is invalid once Extract returns.
type RowWriter interface {
	// Write adds one row, values in [backfilltype.Target.Columns] order. A
	// value that its column cannot hold (NULL in a key or NOT NULL column,
	// NUL byte or invalid UTF-8 in text, text longer than the column
	// allows, a number or time beyond the column's range, unparsable text)
	// is bad data: it does not fail the chunk, the row goes to the
	// exception queue with a reason naming the column, its limit and the
	// value, and Write returns nil. Every value a column can hold is taken,
	// as a Go value or as text: NaN and ±Inf floats (also in an
	// unconstrained numeric), 'infinity' and '-infinity' times
	// ([TimeInfinity], [TimeNegInfinity]), years 4714 BC to 294276 AD
	// (dates to 5874897 AD; package internal/pgconv reads their text
	// forms). Times are stored in whole microseconds: a time.Time (or
	// time.Duration) with nanoseconds is truncated toward the past;
	// date/time text with more than six fractional digits is rounded as
	// PostgreSQL rounds it. A row no data can make valid is an extractor
	// bug: a wrong number of values, or a Go type that no conversion
	// accepts for its column (a struct for an integer column); Write then
	// returns an error wrapping [ErrExtractor] and the chunk fails without
	// retry, even if the extractor ignores the error. Write returns an
	// error also when the chunk cannot go on (the staging COPY failed, ctx
	// is done, too many rejects); the extractor should then return it.
	Write(ctx context.Context, values ...any) error
	// Reject records a row the extractor could not convert. raw is stored
	// as jsonb (any JSON-marshalable value; a value that cannot be
	// marshalled is stored as its fmt %v text), column may be empty. Any
	// value is stored: a map or slice that contains itself, or a pointer
	// cycle, is cut where it recurs (marked "<cycle>"), nesting beyond 32
	// levels is marked "<too deep>", and a raw row beyond 64 KiB of JSON
	// is stored truncated ({"truncated": true, "bytes": ..., "prefix":
	// ...}).
	Reject(ctx context.Context, raw any, column, reason string) error
}

// Config configures a [Runner]. The zero value is valid: every field has a
// default.
type Config struct {
	// Concurrency is how many chunks run at once, each in its own
	// transaction on its own connection. Default 1. Merges of chunks that
	// share business keys (in this run, in other processes running the
	// job, or in other jobs on the target) take locks on those keys and
	// run one after the other, so each sees the rows the others
	// committed: History, NewerVersionWins and chunks that agree on each
	// key's content leave the table that running the chunks one at a time
	// leaves, whatever the Concurrency.
	//
	// Where chunks of one run disagree on a key's content and the mode
	// itself decides by order, the winner is the chunk that commits first
	// (TargetWins, AppendOnly, Keyless) or last (SourceWins), and above
	// Concurrency 1 commit order is not plan order: the result can differ
	// from run to run. Use a [backfilltype.Target.Version] with
	// NewerVersionWins for an order-independent result; AppendOnly and
	// Keyless queue the loser to the exception queue, so nothing is lost
	// silently there.
	Concurrency int
	// SerialExtract turns extracting ahead off: each worker then extracts
	// a chunk only after its previous chunk's transaction ended. By
	// default (false) each of the Concurrency workers leases and extracts
	// its next chunk while its current chunk's transaction runs, so the
	// extractor and the database work at the same time. A worker then
	// holds at most two chunks (one written, one extracted and waiting in
	// its spool), still runs one chunk transaction at a time, writes its
	// chunks in the order it leased them, and never calls Extract for two
	// chunks at once; but it reads the source while it writes the target,
	// and [Status] may show two chunks in flight per worker. The chunk
	// extracted ahead is in flight like any leased chunk: a pause or a
	// failure of the chunk before it lets it finish, unless the call
	// stopped before its transaction began (then its lease is released
	// and it stays pending). A call extracts serially, and says why once
	// in the log, with [Config.JobConcurrency] (which counts live leases)
	// or when the pool's MaxOpenConns is below 2×Concurrency+2 (a
	// transaction and a lease per worker, plus the heartbeat). Set it for
	// a source that must not be read while the target is written.
	SerialExtract bool
	// MemoryBudget is about how much resident memory, in bytes, a process
	// running the Runner's calls holds at most, whatever the width of its
	// rows. The library counts its buffers of rows against it, across all
	// the Runner's calls and chunks at once: 16 MiB are left for what a
	// process holds with no rows (code, runtime, connections), and half
	// of the rest for the garbage collector's slack; of the other half,
	// the spools of the chunks in flight (the rows extracted and waiting
	// for their transaction) hold a quarter of the rest (an eighth in one
	// spool; past that a spool moves its rows to a temporary file), the
	// identities the merge tracks to find duplicate keys in Go an eighth
	// (past it, duplicates are found in SQL), and the rejected rows held
	// until their chunk commits an eighth. The bytes counted are the
	// rows' own (their values' sizes as extracted), so a chunk of wide
	// rows moves to its file after fewer rows. A chunk whose rejected
	// rows do not fit in their share fails like one past
	// MaxRejectsPerChunk (with an error wrapping [ErrTooManyRejects] that
	// names the chunk, its rejected rows and their bytes): it rolls back
	// and nothing is dropped; it is retried ([IsRetryable]) when its own
	// rejects hold at most half the share and the other chunks in flight
	// the rest. What the extractor itself holds is not
	// counted. Default [DefaultMemoryBudget] (64 MiB: 12 MiB of spools);
	// at least 32 MiB. Setting GOMEMLIMIT to the budget makes the garbage
	// collector hold the heap to it too.
	MemoryBudget int64
	// MaxAttempts is how many times a chunk is tried before the run stops
	// with it failed; only retryable errors ([IsRetryable]) are retried.
	// Default 3. Waits (see LockRetries) and connection faults of the
	// chunk's transaction (a lost connection, a terminated backend, a
	// server restarting: retried for up to 2 × StaleAfter, see the
	// package documentation, "Transient faults") are not attempts.
	MaxAttempts int
	// RetryBackoff is the wait before the second attempt; it doubles with
	// each further attempt. Default 100ms.
	RetryBackoff time.Duration
	// MaxRejectsPerChunk fails a chunk that rejects more rows than this
	// (the chunk rolls back: nothing is dropped). A chunk worked in
	// sub-chunks (ChunkTarget) counts the rejects of all its sub-chunks:
	// the sub-chunk that takes the plan chunk past the limit fails, and
	// the sub-chunks committed before it stay (the chunk fails with them
	// recorded, as any failure between two sub-chunks). Rejected rows are held
	// in memory until the chunk commits (at most 64 KiB of raw row each),
	// so the limit also bounds that memory. 0 means
	// [DefaultMaxRejectsPerChunk]; a negative value means no limit.
	MaxRejectsPerChunk int
	// MaxStagingRejects is how many distinct values PostgreSQL may refuse
	// while staging (COPY) one chunk before the chunk fails. Such values
	// are those the row writer passes as text for PostgreSQL to read: an
	// enum label, a value a domain's CHECK or NOT NULL refuses, malformed
	// inet. Every row holding a refused value is queued as an exception
	// naming its column, value and PostgreSQL's message, and the chunk is
	// staged again without them from its spool, inside the chunk's
	// transaction (rolled back to a savepoint first): one more staging per
	// refused value, never another extraction, which is what the limit
	// bounds. Past it, the chunk fails with an error wrapping
	// [ErrTooManyRejects] that names the chunk, row, column and value. The
	// rows count toward MaxRejectsPerChunk too. 0 means [DefaultMaxStagingRejects]; a
	// negative value fails the chunk at the first refused value (still
	// naming it). Mergers with [backfilldriver.StagingIsolator] only (the
	// PostgreSQL merger).
	MaxStagingRejects int
	// MaxMergeRefusals is how many staged rows of one chunk the target may
	// refuse while they are merged before the chunk fails: rows that
	// violate a unique constraint or index other than the business key's,
	// a CHECK or a foreign key, rows a trigger raises an error for, rows
	// whose index entry exceeds the btree limit, and other per-row data
	// errors. Each such row is queued as an exception naming the
	// constraint (or trigger), its business key and PostgreSQL's message,
	// and the rest of the chunk merges (found by set-based pre-checks,
	// then bisection inside savepoints). Past the limit the
	// chunk fails with an error wrapping [ErrTooManyRejects] naming the
	// chunk, row, key and constraint. The rows count toward
	// MaxRejectsPerChunk too. A replay (a new run) refuses the same rows
	// again and queues them once more, under its own batch. 0 means the
	// default, 100; a negative value fails the chunk at the
	// first refused row (still naming it). Errors that are not about a
	// row (serialization failures, deadlocks, lock timeouts,
	// cancellation, lost connections) still fail, and retry, the chunk.
	MaxMergeRefusals int
	// Manifest records runs and chunks, and leases them to workers: it
	// must implement [backfilldriver.ManifestLeases] (else NewWithDB
	// returns an error wrapping [ErrUnsupported]), as [PGManifest] and
	// backfilltest's Manifest do. Default: [NewPGManifest] with schema
	// "backfill".
	Manifest Manifest
	// Merger stages and merges rows. Default: the PostgreSQL merger.
	Merger Merger
	// Logger receives one record per chunk and run event. Nil discards.
	Logger *slog.Logger
	// Hooks observe chunk progress (for progress bars and metrics). Nil
	// means none.
	Hooks Hooks
	// Tracer traces the chunks of the Runner's runs, one span per claimed
	// attempt of a chunk; when it also implements
	// [backfilltrace.PhaseTracer], [backfilltrace.RunTracer],
	// [backfilltrace.ThrottleTracer], [backfilltrace.PauseTracer] or
	// [backfilltrace.RetryTracer] (looked up once, by [NewWithDB]), their
	// phases, runs and events. Nil means none, at no cost. contrib/otel and
	// contrib/prometheus adapt it to OpenTelemetry and Prometheus.
	Tracer backfilltrace.Tracer
	// WorkerID names this process in the manifest (defaults to
	// hostname:pid).
	WorkerID string
	// HeartbeatInterval is how often a call of [Runner.Run] refreshes its
	// worker's heartbeat in the manifest
	// ([backfilldriver.ManifestLeases]), from a goroutine of its own, and how often a worker waiting for chunks
	// held by others looks again (at most every second). Default
	// [DefaultHeartbeatInterval]. The heartbeat needs a connection of
	// the pool while every chunk holds one: give the *sql.DB a
	// MaxOpenConns of at least Concurrency + 2 (Run warns otherwise), and
	// 2×Concurrency + 2 for workers to extract ahead (the default; see
	// [Config.SerialExtract]).
	HeartbeatInterval time.Duration
	// StaleAfter is how old a worker's heartbeat may get before other
	// workers fence it: a worker that finds nothing to claim while chunks
	// are held by others waits, and terminates the backend of a holder
	// whose heartbeat is older than StaleAfter, which rolls the
	// holder's chunk back and frees it; a chunk whose merge waits for key
	// locks held by a stale worker fences it likewise. It also bounds, in each chunk's
	// transaction, the TCP keepalives and tcp_user_timeout, so that the
	// server itself ends the transaction of a worker cut off. A healthy
	// worker waits behind
	// a frozen one at most about StaleAfter + HeartbeatInterval + a
	// second. Default: the larger of [DefaultStaleAfter] and three
	// HeartbeatIntervals (so a HeartbeatInterval over 10 s raises it, and
	// the wait bound with it, past one minute). Set, it must exceed
	// twice HeartbeatInterval.
	StaleAfter time.Duration
	// LockTimeout bounds every lock wait of the library's statements
	// (PostgreSQL's lock_timeout, set locally in each chunk's transaction
	// and in the short manifest transactions): it caps the timeouts of
	// LockRetries, and an application session queued behind a lock the
	// library waits for waits about this long at most. A wait that times
	// out is retried (LockRetries, [LockRetry]). One exception: the
	// merge's key locks wait beyond it for a live worker's merge of the
	// same keys (in steps that fence a stale holder; see the package
	// documentation, "Fencing"). Default
	// [DefaultLockTimeout]; negative: the library sets no lock_timeout
	// (the session's, role's or database's applies) and retries the waits
	// that end anyway with LockRetries' sleeps.
	LockTimeout time.Duration
	// StatementTimeout is PostgreSQL's statement_timeout of the merge,
	// validation and checkpoint of each chunk and of the short manifest
	// transactions (set locally). The extractor's time is never charged
	// with it (it runs outside any transaction under a lease; without
	// one, its COPY runs with statement_timeout 0). 0 (the default) keeps the
	// session's value (role's, database's): a chunk's merge takes as long
	// as its size needs, which no library default can know. Negative:
	// none (statement_timeout 0) for the merge, whatever the session's. A
	// statement that times out is retried like a lock wait (LockRetries).
	StatementTimeout time.Duration
	// LockRetries is the retry table of the waits of a chunk's attempt:
	// lock timeouts (55P03), deadlocks (40P01), serialization failures
	// (40001) and statement timeouts (57014, while ctx is not done). Try n
	// of an attempt runs with lock_timeout LockRetries[n].Timeout (at most
	// LockTimeout); a try that waits is rolled back, recorded
	// ([backfilldriver.ManifestWaits]) and logged with its blockers, and
	// the chunk is tried again after a jittered LockRetries[n].Sleep
	// (after a serialization failure or a deadlock, which wait on nobody:
	// 20 ms doubled on each try, at most that Sleep), without counting
	// toward MaxAttempts; a wait on the table's last row
	// ends the attempt as failed (its Sleep is not used). Nil means
	// [DefaultLockRetries](LockTimeout). Rows must have a Timeout and Sleep
	// of at least zero (a zero Timeout: no lock_timeout on that try).
	LockRetries []LockRetry
	// Throttles hold the run's claims while a signal is high, and pause the
	// run at a critical level (see [backfillthrottle.Throttle]). Each call
	// of Run reads every signal every ThrottleInterval and before its first
	// claim; any throttle that holds stops the call's workers from claiming
	// (chunks in progress finish). Nil means none.
	Throttles []backfillthrottle.Throttle
	// ThrottleInterval is how often the signals are read: a raised
	// signal holds every worker of the call within one interval. Default
	// [backfillthrottle.DefaultThrottleInterval] (500 ms).
	ThrottleInterval time.Duration
	// RowsPerSecond caps the rows the whole job reads per second, across
	// every process running it: each call of Run takes an even share,
	// RowsPerSecond divided by the run's live workers (re-read every
	// ThrottleInterval; the whole cap without
	// [backfilldriver.ManifestWorkers]). A chunk's rows are charged when it
	// ends, and the next claim waits until they are paid for (a token
	// bucket of golang.org/x/time/rate with one second of burst); with
	// ChunkTarget, a sub-chunk's rows are charged when it commits, and
	// the next sub-chunk of the same chunk waits likewise, its lease held.
	// An adaptive throttle's cut paces them the same way. Zero means no
	// cap.
	RowsPerSecond float64
	// ChunkTarget is the duration a chunk's transaction aims at: a
	// chunk of IntRange or of a time chunker (Hours, Days, Months, Every)
	// whose rows would take longer is worked through in sub-chunks, each
	// a half-open sub-interval of it with its own transaction and
	// checkpoint, sized from a moving average of the rate the call
	// observes (rows per second of a transaction); a sub-chunk whose
	// transaction hits statement_timeout or lock_timeout is split and
	// retried without counting an attempt. The plan (its chunks and
	// fingerprint) does not change: sub-chunks are recorded as
	// refinements of their plan chunk, which is done, with their summed
	// counts, when its last sub-chunk commits; a resumed run goes on
	// from the last sub-chunk committed. The Extractor is called with
	// each sub-chunk (its ID derived from its bounds). Other chunkers,
	// Job.SkipUnchanged and publish modes other than PublishPerChunk run
	// chunks whole. 0 (the default): off, every chunk is one
	// transaction. The knob chunk_target_ms (Runner.SetKnob, set_knob)
	// replaces it live for a run, 0 turning adaptation off.
	ChunkTarget time.Duration
	// ChunkMinRows is the fewest rows a sub-chunk is sized for (the
	// last of a chunk may have fewer). Default [DefaultChunkMinRows].
	ChunkMinRows int64
	// ChunkMaxRows caps the rows of a sub-chunk when ChunkTarget is set
	// (0: no cap); the knob chunk_max_rows replaces it live.
	ChunkMaxRows int64
	// JobConcurrency, when > 0, caps the chunks of the run in progress
	// at once across every process (each process also runs at most
	// Concurrency). A chunk is leased only while fewer than
	// JobConcurrency chunks of the run hold a live lease; a lease lasts
	// from the claim to the commit of the chunk's transaction, so the cap
	// covers the extraction and the merge, and a worker that died holds
	// its place only until its lease is no longer live
	// ([Config.StaleAfter]). A worker that finds the cap reached waits and
	// tries again. Give every process the same value. The run's
	// job_concurrency knob ([Runner.SetKnob]) replaces it in every
	// process, also one started with 0.
	JobConcurrency int
	// ListenURL is a lib/pq connection string of a direct connection to
	// the server (not through PgBouncer in transaction mode, where LISTEN
	// does not work) on which each call of Run LISTENs for the control
	// notifications of [PGManifest] (channel: the manifest's schema
	// name), so that a pause, cancel or knob set from SQL reaches its
	// workers at once. Empty: no LISTEN. Either way each call also reads
	// its run's control state every ThrottleInterval and after each
	// chunk, so a decision takes effect within one ThrottleInterval.
	ListenURL string
	// ReturnOnPause makes [Runner.Run] (and [Runner.RunGraph], for its
	// graph's run) return instead of waiting while
	// its run is paused or awaits approval: an error wrapping
	// [ErrRunPaused] (an operator's pause, a throttle's critical level),
	// [ErrGateFailed] (a quality gate or the run reject gate that failed
	// on a chunk of this call) or [ErrAwaitingApproval], once the chunks
	// in flight are checkpointed: for scripts that want to end on a
	// pause. Default false: Run waits for the resume or the approval (see
	// [Runner.Run]). [Work] always waits, whatever it says.
	ReturnOnPause bool
}

// Defaults of [Config.HeartbeatInterval] and [Config.StaleAfter]: a
// healthy worker waits behind a frozen one at most about 36 s, within
// the documented bound of one minute.
const (
	DefaultHeartbeatInterval = backfilltype.DefaultHeartbeatInterval
	DefaultStaleAfter        = backfilltype.DefaultStaleAfter
)

// DefaultMemoryBudget is the default of [Config.MemoryBudget]: 64 MiB.
const DefaultMemoryBudget = 64 << 20

// DefaultMaxRejectsPerChunk is the default of [Config.MaxRejectsPerChunk].
const DefaultMaxRejectsPerChunk = 100_000

// Hooks observe a run. Every method is called from the goroutine running
// the chunk; implementations must be safe for concurrent use when
// Concurrency > 1.
type Hooks interface {
	// ChunkDone is called after a chunk committed, with its counts.
	ChunkDone(ctx context.Context, batchID int64, r ChunkResult)
}

// HooksFunc adapts a function to [Hooks].
type HooksFunc func(ctx context.Context, batchID int64, r ChunkResult)

// ChunkDone calls f.
func (f HooksFunc) ChunkDone(ctx context.Context, batchID int64, r ChunkResult) { f(ctx, batchID, r) }

// Counts are the row outcomes of a chunk or a run. For every chunk
// Read == Inserted + Updated + Unchanged + Rejected + Deduplicated.
type Counts = backfilltype.Counts

// ChunkResult is what one completed chunk recorded in the manifest.
type ChunkResult = backfilltype.ChunkResult

// Report summarises a run as recorded in the manifest.
type Report struct {
	// BatchID is the run's batch ID.
	BatchID int64
	// Job is the job name.
	Job string
	// Status is the run status after this call.
	Status RunStatus
	// Resumed is true when this call continued an existing run.
	Resumed bool
	// ChunksTotal is the number of chunks in the plan; ChunksDone how many
	// are completed for good (by this call or earlier ones); ChunksRun how
	// many this call checkpointed (done or open).
	ChunksTotal, ChunksDone, ChunksRun int
	// ChunksOpen counts the chunks checkpointed as [ChunkOpen]: loaded,
	// but ending after the run's horizon (watermark or now), so not final;
	// OpenChunks lists their IDs. The next call reads them again; until
	// then the run is not completed (Status stays running) and Run
	// returns an error wrapping [ErrChunksOpen] with this report.
	ChunksOpen int
	OpenChunks []string
	// Counts sums every checkpointed (done or open) chunk of the run (not
	// only this call's), each as it stands: a chunk read several times
	// while open counts its rows once, as its latest read found them
	// ([backfilltype.Counts.Reread]), so a row read by four reads counts
	// once in Read (and once in Rejected when every read rejected it).
	Counts Counts
	// Warnings says what in the job may lose or hold back rows, e.g. a
	// scope that reaches into the future, or a date-typed ChunkColumn
	// used with a watermark. Each is also logged.
	Warnings []string
	// ChunksSkipped counts the run's done chunks (checkpointed by this call
	// or earlier ones, as the manifest records them:
	// [backfilltype.ChunkState.Skipped]) whose staging and merge were
	// skipped, their rows unchanged since the load they were compared with
	// ([Job.SkipUnchanged]); they are among ChunksDone.
	ChunksSkipped int
	// Elapsed is the wall time of this call.
	Elapsed time.Duration
	// ChecksPassed and ChecksFailed count the verdicts of the run's
	// validations ([Job.Validators]): one per chunk and check, the latest
	// recorded, however often the chunk was judged (an attempt a gate
	// rolled back, then a resume; an open chunk read again).
	// FailedChecks names the failed ones, as "chunk: check: expected ...,
	// got ...", with " (accepted)" for those an operator accepted
	// ([Runner.AcceptGate]); ChecksAccepted counts these.
	ChecksPassed, ChecksFailed, ChecksAccepted int
	FailedChecks                               []string
	// SupersededChecks names the failed results that a later judgment of
	// the same chunk and check replaced, such as the gate failure of an
	// attempt that rolled back before a resume, with the attempt number.
	// They are evidence, not counted in ChecksPassed or ChecksFailed.
	SupersededChecks []string
}
