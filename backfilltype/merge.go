package backfilltype

import (
	"slices"

	"github.com/pgbackfill/backfill/internal/pgconv"
)

// Column describes one column of a target as the merger found it.
type Column struct {
	// Name is the column name, unquoted.
	Name string
	// Type is the declared type as format_type prints it ("character
	// varying(3)", "timestamp with time zone"); "" when unknown (fakes).
	Type string
	// BaseType is the type's name in pg_type ("varchar", "int8",
	// "timestamptz"); "" when unknown, in which case values are passed
	// through without conversion.
	BaseType string
	// MaxLen is the maximum length in characters of a varchar(n) or
	// char(n) column, 0 for none.
	MaxLen int
	// Collation is the column's collation when it is not its type's
	// default ("" otherwise), as a quoted, schema-qualified name. Staging
	// uses it so that keys compare as in the target (a nondeterministic,
	// case-insensitive collation deduplicates "Apple" and "APPLE").
	Collation string
	// TextCompare: the type has no usable equality operator (json, point,
	// arrays of them, composites); change detection compares its text.
	TextCompare bool `json:"-" db:"-"`
	// Kind is the (base) type's pg_type.typtype ("b", "e" enum, "c"
	// composite, "r" range, ...); UserType: it is not a pg_catalog type.
	// ElemKind and UserElem say the same of an array's element type. ""
	// and false when unknown (a TableInfo not from the PostgreSQL
	// merger's Prepare).
	Kind, ElemKind     string `json:"-" db:"-"`
	UserType, UserElem bool   `json:"-" db:"-"`
	// Precision and Scale are a numeric(p,s) column's declared precision
	// and scale (PostgreSQL docs, 8.1.2 "Arbitrary Precision Numbers");
	// Precision is 0 for an unconstrained numeric.
	Precision, Scale int
	// NotNull is true for NOT NULL columns.
	NotNull bool
	// Key is true for business key columns (in History mode not
	// ValidFrom, which is part of the version's identity but not of the
	// business key).
	Key bool
	// Computed says how the runner fills a column the extractor does not
	// write: "derive" (a Keyless key, from [Target.Derive]), "hash" (the
	// [Target.HashColumn]) or "" for written columns.
	Computed string
}

// TableInfo is a prepared target: the Target it came from, with defaults
// filled in, and its staged columns: first the Written columns of
// [Target.Columns] in order, then the computed ones (derived keys, hash).
type TableInfo struct {
	Target  Target
	Columns []Column
	// Written is how many of Columns the extractor writes.
	Written int
	// Chunk is set by the runner for each chunk before the merger's Stage:
	// the batch and chunk being merged, for lineage and the undo log.
	Chunk ChunkRef

	// KeyIndexes names the unique indexes that cover the identity, and
	// the partitions' indexes attached to them (the PostgreSQL merger).
	KeyIndexes []string `json:"-" db:"-"`
	// OpenIndexes: History's partial unique indexes on the business key
	// (one open version per key), name -> predicate (the PostgreSQL
	// merger).
	OpenIndexes map[string]string `json:"-" db:"-"`
	// LockRoot is the canonical name of the target's partition root (the
	// target itself when it is not a partition), which names its key
	// locks' namespace; "" when unknown.
	LockRoot string `json:"-" db:"-"`
	// TupleIdentity: the target and each of its partitions are heap
	// tables and every column is of a built-in base type (or an array or
	// domain of one) that no catalog lookup reads, so a target
	// fingerprint may hash the rows' tuple identities (table, ctid, xmin)
	// instead of their values, with the target's shape read by the same
	// statement (tupleHashSQL, tupleShapeSQL). The PostgreSQL merger,
	// read at Prepare; partitioned: the target is a partitioned table.
	TupleIdentity, Partitioned bool `json:"-" db:"-"`
	// InheritanceChild names a child of the target by inheritance, ""
	// for none: runs refuse such a target (pgstore.RefuseInheritanceParent,
	// Merger).
	InheritanceChild string `json:"-" db:"-"`
	// InsertOnly: an Upsert that may update rows, prepared for a role
	// (role) without UPDATE on the columns it would write; the merge
	// neither locks nor updates target rows and fails a chunk that would
	// Update one with ErrPrivilege (the PostgreSQL merger).
	InsertOnly bool   `json:"-" db:"-"`
	Role       string `json:"-" db:"-"`
	// NoUpdate: the written columns the role may not update (in table
	// order); NoUpdateAll: none of them.
	NoUpdate    []string `json:"-" db:"-"`
	NoUpdateAll bool     `json:"-" db:"-"`
}

// Identity returns the columns that identify one target row: Key, plus
// ValidFrom in History mode.
func (info TableInfo) Identity() []string {
	id := slices.Clone(info.Target.Key)
	if info.Target.Mode == History {
		id = append(id, info.Target.ValidFrom)
	}
	return id
}

// ChunkRef names the chunk a stager merges and where its undo log goes.
type ChunkRef struct {
	// BatchID is the run's batch ID, written to lineage columns.
	BatchID int64
	// Seq is the chunk's position in its plan.
	Seq int
	// UndoTable is the quoted, schema-qualified undo log table
	// ("backfill"."undo"), or "" for no undo log ([RollbackNone]).
	UndoTable string
	// DeliveredTable is the quoted, schema-qualified table where the
	// merge summarises the rows it delivered unchanged that other batches
	// last wrote ("backfill"."delivered"), so that their rollback leaves
	// those rows alone; "" for none (no lineage or no PostgreSQL
	// manifest).
	DeliveredTable string
	// MaxRefused is how many staged rows the target may refuse at merge
	// time (another unique constraint, a CHECK, a foreign key, a trigger
	// that raises, an index row over the btree limit) before the merge
	// fails: up to MaxRefused such rows are returned in
	// MergeResult.Rejected and the rest of the chunk merges; the next one
	// fails the merge with an error wrapping [ErrTooManyRejects] that
	// names its row, key and constraint. 0 refuses none: the first such
	// row fails the merge, named. The runner sets it from
	// backfill.Config.MaxMergeRefusals.
	MaxRefused int
}

// MergeResult counts what a merge did with the staged rows:
// staged rows == Inserted + Updated + Unchanged + Deduplicated +
// len(Rejected).
type MergeResult struct {
	Inserted, Updated, Unchanged, Deduplicated int64
	// Rejected are staged rows the merge refused ([AppendOnly] conflicts,
	// [Keyless] ambiguities, rows the target refused, see
	// [ChunkRef.MaxRefused]), with Row, Raw, Column and Reason set. The
	// runner counts them as rejected and adds them to the exception queue.
	Rejected []Exception
	// Closed counts History versions whose valid_to the merge changed
	// because a version was inserted after them (not staged rows, so not
	// part of the accounting).
	Closed int64
	// Disagreed counts staged rows of a [TargetWins] Upsert whose key's
	// target row another chunk of the same batch wrote (lineage InsertedBy
	// or UpdatedBy is the batch) with other content: chunks of one run
	// disagree, and the one that committed first won (see
	// backfill.Config.Concurrency). The rows count as unchanged; the runner
	// logs a warning. Not part of the accounting; 0 without lineage
	// columns, for other policies and modes, and for mergers that do not
	// look.
	Disagreed int64
}

// Conv is what value conversion needs of c.
func (c Column) Conv() pgconv.Column {
	return pgconv.Column{Name: c.Name, Type: c.Type, BaseType: c.BaseType, MaxLen: c.MaxLen,
		Precision: c.Precision, Scale: c.Scale, NotNull: c.NotNull, Key: c.Key}
}

// KeyRule derives one key column of a [Keyless] target from a source
// column: the source value (text) passes through Rules in order.
type KeyRule struct {
	// Column is the derived key column of the target (not in
	// Target.Columns).
	Column string
	// From is the source column, one of Target.Columns, holding text.
	From string
	// Rules are applied in order; e.g. Trim, CollapseSpace, NFC, CaseFold.
	Rules []Normalizer
	// NullAsEmpty derives "" from a NULL source value instead of
	// rejecting the row ("missing key column"). Opt in only when NULL and
	// empty mean the same thing in the source.
	NullAsEmpty bool
}
