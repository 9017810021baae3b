package backfilltype

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Mode says how a [Target] identifies records and what a merge does with a
// staged row whose business key is already present. Decide identity before
// the upsert strategy: the mode is part of the plan.
type Mode string

const (
	// Upsert is for mutable master data: a staged row whose business key
	// exists replaces the target row when any non-key column differs
	// (IS DISTINCT FROM, NULL-safe) and is left alone otherwise; absent
	// keys are inserted. [Target.Conflict] decides who wins a disagreement.
	// It is the default.
	Upsert Mode = "upsert"
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
	AppendOnly Mode = "append_only"
	// History is versioned history (SCD type 2). Each version is a row
	// keyed by Key plus [Target.ValidFrom]; [Target.ValidTo] holds the
	// exclusive end of its half-open interval [valid_from, valid_to), NULL
	// for the current version (an open end, never a sentinel date). The
	// extractor writes versions with their valid_from; the merge keeps
	// every version the source asserted at a distinct valid_from, inserts
	// late versions at their place (splitting the interval they fall
	// into) and recomputes valid_to for the keys it touched, so intervals
	// per key tile its history with no overlap and no gap. A version whose
	// (key, valid_from) exists is unchanged when its columns are identical
	// (NULL-safe) and corrects the version in place otherwise. Versions
	// equal to their predecessor are kept, not collapsed: collapsing
	// would discard what the source said and make the result depend on
	// arrival order.
	History Mode = "history"
	// Keyless is for legacy sources without a good key: the Key columns
	// are derived by [Target.Derive] rules (trim, case fold, Unicode NFC,
	// whitespace collapse, ...) from source columns. Rows whose derived
	// keys collide with different content, inside a chunk or with the
	// target, all go to the exception queue (reason "ambiguous derived
	// key"); identical rows are deduplicated.
	Keyless Mode = "keyless"
)

// ConflictPolicy decides, in [Upsert] mode, which side wins when a staged
// row and the target row of the same business key differ.
type ConflictPolicy string

const (
	// SourceWins always takes the staged row. It is the default. Order
	// dependent when the same key appears in several chunks (of one run,
	// or of runs in parallel) with different content: the chunk whose
	// transaction commits last wins. At Concurrency 1 that is the chunk
	// planned last; above it, whichever finishes last, which can differ
	// from run to run. Use a [Target.Version] with NewerVersionWins for a
	// result independent of order and concurrency.
	SourceWins ConflictPolicy = "source_wins"
	// TargetWins inserts missing keys only; differing existing rows are
	// kept and counted as unchanged. Order dependent when the same key,
	// absent from the target, appears in several chunks with different
	// content: the chunk whose transaction commits first inserts it and
	// wins, the others find it and leave it (counted unchanged, not
	// queued). At Concurrency 1 that is the chunk planned first; above it,
	// whichever commits first, which can differ from run to run. Use a
	// [Target.Version] with NewerVersionWins for a result independent of
	// order and concurrency.
	TargetWins ConflictPolicy = "target_wins"
	// NewerVersionWins takes the row with the greater [Target.Version]
	// value (NULL is older than any value). Ties with different content
	// are broken by the greater text form of the non-key columns, so the
	// final state is the same whatever the arrival order of versions.
	// Inside a chunk the same rule picks the surviving row.
	NewerVersionWins ConflictPolicy = "newer_version_wins"
)

// DuplicatePolicy is the deterministic rule for business keys that occur
// more than once in one chunk ([Upsert] with SourceWins or TargetWins, and
// [History] per (key, valid_from)).
type DuplicatePolicy string

const (
	// KeepLast keeps, per business key, the row written last by the
	// extractor (highest row number) and counts the others as deduplicated.
	// It is the default. Deterministic as long as the extractor writes a
	// chunk's rows in a deterministic order.
	KeepLast DuplicatePolicy = "keep_last"
	// KeepFirst keeps the row written first and counts the others as
	// deduplicated.
	KeepFirst DuplicatePolicy = "keep_first"
)

// Target describes the table a job writes to and how records are
// identified in it: which columns identify a record (Key), which may
// change (the other Columns), and which side wins a disagreement (Mode,
// Conflict).
type Target struct {
	// Table is the target table, optionally schema-qualified
	// ("sales.order_lines"). Schema and table are split on a dot outside
	// double quotes; each part is taken literally (no case folding) and
	// quoted as an identifier. A part that holds a dot or a double quote
	// must be enclosed in double quotes, with "" for a quote inside:
	// `"we.ird".t`, `we."ird.t"`, `"a""b".c`. A name with more than one
	// unquoted dot, an empty part or an unterminated quote is refused
	// with an error wrapping [ErrInvalidConfig]; the name is resolved
	// through the catalog (to_regclass of the quoted parts), so it names
	// one table or none. backfill.Merger.Prepare returns the schema-qualified
	// name in this form.
	Table string
	// Key lists the business key columns. The table must have a unique
	// index or constraint on exactly these columns (in History mode: Key
	// plus ValidFrom), in any order, otherwise backfill.Merger.Prepare returns
	// [ErrNoUniqueKey]. Required.
	Key []string
	// Columns lists, in order, the columns the extractor writes with
	// backfill.RowWriter.Write. It must include every Key column (in
	// Keyless mode the derived key columns are filled by Derive and must
	// not be listed; in History mode ValidFrom is listed and ValidTo is
	// not). Empty means all of the table's columns in table order, except
	// generated columns, identity columns GENERATED ALWAYS, and the columns
	// the library fills (derived keys, ValidTo, IngestedAt, HashColumn,
	// lineage). Columns with defaults are included: list Columns to leave
	// them to their defaults.
	Columns []string
	// Mode is the merge mode; empty means [Upsert].
	Mode Mode
	// Duplicates resolves business keys repeated inside one chunk; empty
	// means [KeepLast].
	Duplicates DuplicatePolicy
	// Conflict is the Upsert conflict policy; empty means [SourceWins].
	Conflict ConflictPolicy
	// Version names the column compared by [NewerVersionWins]: any type
	// with an ordering (integer, numeric, timestamp). Typically the
	// source's version number or modification time. Required with
	// NewerVersionWins.
	Version string
	// ValidFrom and ValidTo name the interval columns of History mode;
	// defaults "valid_from" and "valid_to". Both must have the same type
	// (timestamptz, timestamp, date or an integer type). A row with a NULL
	// ValidFrom is rejected ("null value in NOT NULL column"), even when
	// the column is nullable.
	ValidFrom, ValidTo string
	// Derive lists, in Keyless mode, how each Key column is computed from
	// a source column. Every Key column needs exactly one rule.
	Derive []KeyRule
	// EventTime names the column holding the event time: the instant the
	// record is about, which assigns its reporting period. Documentation
	// and lineage only (recorded in the plan); it may differ from the
	// chunking dimension, e.g. when extracting by ModifiedAt.
	EventTime string
	// ModifiedAt names the column holding the source modification time:
	// the extraction cursor that watermarks and backfill.Runner.Handoff use.
	// Recorded in the plan.
	ModifiedAt string
	// IngestedAt, if set, names a column the library fills with the
	// ingestion time: the time the chunk's transaction started
	// (timestamptz), on every inserted or updated row. It is excluded from
	// change detection, so a replay does not touch it.
	IngestedAt string
	// Lineage names the lineage columns the library maintains on target
	// rows. By default it uses the columns named backfill_inserted_by and
	// backfill_updated_by (bigint) when the table has them.
	Lineage Lineage
	// HashColumn, if set, names a column that stores a hash of the non-key
	// columns change detection compares (a SHA-256 of the canonical text
	// of their stored values, computed by the library's row writer). The
	// merge then compares hashes instead of those columns to detect
	// changes, and decides as without a hash column: equal hashes mean
	// equal stored values (numeric 1.50 and 15.0e-1 hash alike, 1.5 and
	// 1.50 do not in an unconstrained numeric; -0 and 0 do not). Columns
	// whose text the row writer passes to PostgreSQL's own input
	// (interval, time, jsonb, arrays, enums, inet and the other types it
	// does not convert) are not hashed; the merge compares them beside
	// the hash. It never
	// identifies a row. The package documentation of backfill, "Equality",
	// states the rule.
	HashColumn string
}

// Lineage configures the lineage columns of a [Target]: which batch
// inserted a row and which batch last changed it. They are written on
// every insert and update, never compared (a replay does not touch them),
// and they let a rollback refuse to undo rows that a later batch changed.
// Ingestion time is [Target.IngestedAt].
type Lineage struct {
	// InsertedBy names a bigint column set to the batch ID that inserted
	// the row; default "backfill_inserted_by" when the table has it.
	InsertedBy string
	// UpdatedBy names a bigint column set to the batch ID that last
	// inserted or changed the row; default "backfill_updated_by" when the
	// table has it.
	UpdatedBy string
	// Off disables lineage even when the default columns exist.
	Off bool
}

// RollbackMechanism is how a job's batches can be withdrawn, chosen before
// writing and recorded in the plan (backfill.Job.Rollback).
type RollbackMechanism string

const (
	// RollbackUndoLog keeps, in the chunk's transaction, the prior image of
	// every row a batch updated (and the SCD2 intervals it closed), and
	// finds the rows it inserted by lineage; backfill.Runner.Rollback restores
	// them. It needs the Lineage UpdatedBy and InsertedBy columns. The
	// default when the target has them.
	RollbackUndoLog RollbackMechanism = "undo_log"
	// RollbackNone explicitly accepts that batches cannot be withdrawn.
	RollbackNone RollbackMechanism = "none"
	// RollbackSwitchBack withdraws a batch published by a versioned view or
	// partition swaps by pointing readers back to the versions it
	// replaced, which are kept. The default of those publish modes.
	RollbackSwitchBack RollbackMechanism = "switch_back"
)

// DateMeaning says what a date without a time means in a source.
type DateMeaning string

const (
	// DateUnspecified: the job declared nothing (no date-only values, or
	// their meaning is not known).
	DateUnspecified DateMeaning = ""
	// DateLocalCalendarDay: the local calendar day in backfill.Job.Zone.
	DateLocalCalendarDay DateMeaning = "local calendar day"
	// DateAccountingPeriod: a business period identifier (the day an
	// entry was booked to), not an instant.
	DateAccountingPeriod DateMeaning = "accounting period"
	// DateProcessingDate: the day the source processed the record.
	DateProcessingDate DateMeaning = "processing date"
)

// Validate checks what can be checked without the table.
func (t Target) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format+" (target %q)", append([]any{ErrInvalidConfig}, append(args, t.Table)...)...)
	}
	if t.Table == "" {
		return fmt.Errorf("%w: Target.Table is required", ErrInvalidConfig)
	}
	if _, _, err := sqlgen.ParseTable(t.Table); err != nil {
		return fmt.Errorf("%w: Target.Table: %w", ErrInvalidConfig, err)
	}
	if len(t.Key) == 0 {
		return bad("Target.Key is required")
	}
	all := append(append(slices.Clone(t.Key), t.Columns...), t.Version, t.ValidFrom, t.ValidTo, t.HashColumn)
	for i, c := range all {
		if c == "" && i < len(t.Key)+len(t.Columns) {
			return bad("empty column name")
		}
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		if seen[c] {
			return bad("column %q repeated in Target.Columns", c)
		}
		seen[c] = true
	}
	return t.validatePolicies(bad)
}

// validatePolicies checks the target's mode and policies and the fields
// that go with them.
func (t Target) validatePolicies(bad func(format string, args ...any) error) error {
	switch t.Mode {
	case "", Upsert, AppendOnly, History, Keyless:
	default:
		return bad("Target.Mode %q is not supported", t.Mode)
	}
	switch t.Duplicates {
	case "", KeepLast, KeepFirst:
	default:
		return bad("Target.Duplicates %q is not supported", t.Duplicates)
	}
	switch t.Conflict {
	case "", SourceWins, TargetWins:
	case NewerVersionWins:
		if t.Version == "" {
			return bad("Target.Version is required with NewerVersionWins")
		}
	default:
		return bad("Target.Conflict %q is not supported", t.Conflict)
	}
	if t.Conflict != "" && t.Mode != "" && t.Mode != Upsert {
		return bad("Target.Conflict applies to Upsert mode only, not %s", t.Mode)
	}
	if len(t.Derive) > 0 && t.Mode != Keyless {
		return bad("Target.Derive applies to Keyless mode only")
	}
	return nil
}

// WithDefaults returns t with its mode, duplicates and conflict policies
// and, in History mode, its interval columns defaulted.
func (t Target) WithDefaults() Target {
	t.Mode = cmp.Or(t.Mode, Upsert)
	t.Duplicates = cmp.Or(t.Duplicates, KeepLast)
	if t.Mode == Upsert {
		t.Conflict = cmp.Or(t.Conflict, SourceWins)
	}
	if t.Mode == History {
		t.ValidFrom = cmp.Or(t.ValidFrom, "valid_from")
		t.ValidTo = cmp.Or(t.ValidTo, "valid_to")
	}
	return t
}
