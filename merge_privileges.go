package backfill

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// An insert-only Upsert. An Upsert that may update rows (SourceWins,
// NewerVersionWins, with content columns) locks the rows it would change
// FOR UPDATE and updates them in a data-modifying CTE: PostgreSQL checks
// UPDATE privilege for both when it plans the statement, even when no
// row is updated (PostgreSQL docs, SELECT, "The Locking Clause"). So a
// first load by a role granted only SELECT and INSERT would fail. Prepare
// finds out whether the role may update the columns the merge writes;
// when it may not, the merge is built without the lock and the update:
// the upsert's CTE only counts the rows it would update, and a chunk
// that has any fails with ErrPrivilege (the chunk's transaction rolls
// back, nothing of it is written). Rows that would stay unchanged are
// counted unchanged, as always.

// upsertMayUpdate reports whether an Upsert of info can update target
// rows (see mergeShape.apply).
func upsertMayUpdate(info TableInfo) bool {
	return info.Target.Mode == Upsert && info.Target.Conflict != TargetWins && len(info.Compared().Content) > 0
}

// prepareInsertOnly sets info.insertOnly (and info.role and
// info.noUpdate) when info is an Upsert that may update rows and the
// session's role lacks UPDATE on a column an update writes.
func prepareInsertOnly(ctx context.Context, db sqlx.ExtContext, oid int64, info *TableInfo) error {
	if !upsertMayUpdate(*info) {
		return nil
	}
	var st struct {
		Missing pq.StringArray `db:"missing"`
		All     bool           `db:"all_missing"`
		Role    string         `db:"role"`
	}
	err := sqlx.GetContext(ctx, db, &st, `SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE NOT has_column_privilege($1::oid, a.attnum, 'UPDATE')), '{}') AS missing,
		coalesce(bool_and(NOT has_column_privilege($1::oid, a.attnum, 'UPDATE')), false) AS all_missing, current_user AS role
		FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY ($2::text[])`,
		oid, pq.Array(info.Compared().Written))
	if err != nil {
		return err
	}
	info.insertOnly, info.role = len(st.Missing) > 0, st.Role
	info.noUpdate, info.noUpdateAll = st.Missing, st.All
	return nil
}

// updateLacks names what UPDATE an insert-only Upsert (see above) lacks
// on the target: the table, and the columns when the role may update
// some of the written columns but not these; with the GRANT statement
// that gives it (column-level then).
func updateLacks(info TableInfo) (what, grant string) {
	t := sqlgen.Table(info.Target.Table)
	if info.noUpdateAll || len(info.noUpdate) == 0 {
		return t, grantOn("UPDATE", "TABLE "+t, info.role)
	}
	cols := sqlgen.List("", info.noUpdate)
	return fmt.Sprintf("%s (columns %s)", t, cols), grantOn("UPDATE ("+cols+")", "TABLE "+t, info.role)
}

// insertOnlyRefused is the error of an insert-only Upsert (see above)
// whose chunk has n rows that would update target rows.
func insertOnlyRefused(info TableInfo, n int64) error {
	what, grant := updateLacks(info)
	return fmt.Errorf("backfill: merge %s: %w: %d rows would update existing rows, but role %s lacks UPDATE on %s; nothing of the chunk was written; "+
		"run %s as an administrator, then run the job again (it resumes)", info.Target.Table, ErrPrivilege, n, sqlgen.Ident(info.role), what, grant)
}
