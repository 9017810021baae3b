package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// ReservedPrefix begins every name that the library's generated SQL gives
// to a column of its own (the staging table's row number) or to a
// subquery's computed column, so that none can collide with a user's
// column. A staged column (written, key, computed or lineage) whose name
// begins with it is refused by [ResolveTarget] with an error wrapping
// [ErrInvalidConfig]. Every other generated name is a table alias that
// the SQL only uses to qualify columns (t."n", never a bare n) or as a
// whole-row reference written t.*, which no column name can shadow.
const ReservedPrefix = pgstore.ReservedPrefix
