package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// SplitTableName splits a table name of the form [Target.Table] accepts
// into its schema ("" when the name has none) and table, unquoted. It
// returns an error wrapping [ErrInvalidConfig] for a name that could mean
// more than one table (more than one dot outside double quotes) or is
// malformed (an empty part, an unterminated quote, a quote inside an
// unquoted part). Mergers call it before looking the table up.
func SplitTableName(name string) (schema, table string, err error) {
	return pgstore.SplitTableName(name)
}

// ReservedPrefix begins every name that the library's generated SQL gives
// to a column of its own (the staging table's row number) or to a
// subquery's computed column, so that none can collide with a user's
// column. A staged column (written, key, computed or lineage) whose name
// begins with it is refused by [ResolveTarget] with an error wrapping
// [ErrInvalidConfig]. Every other generated name is a table alias that
// the SQL only uses to qualify columns (t."n", never a bare n) or as a
// whole-row reference written t.*, which no column name can shadow.
const ReservedPrefix = pgstore.ReservedPrefix

// ResolveTarget checks t against a table and fills in its defaults. It is
// shared by [PGMerger] and the fakes of backfilltest so that both accept
// and refuse the same targets.
//
// table lists the table's writable columns in table order (Name, and, when
// known, Type, BaseType, MaxLen, NotNull; generated and identity-always
// columns excluded). unique lists the column sets of the table's unique
// indexes and constraints. The result's Columns are the written columns
// (Target.Columns, or by default every table column except derived keys,
// ValidTo and HashColumn) followed by the computed ones.
//
// Errors: [ErrInvalidConfig] for an inconsistent Target,
// [ErrTargetNotFound] for a column the table lacks, [ErrNoUniqueKey] when
// no unique index covers exactly the identity (Key; in History mode Key
// plus ValidFrom).
func ResolveTarget(t Target, table []Column, unique [][]string) (TableInfo, error) {
	return pgstore.ResolveTarget(t, table, unique)
}
