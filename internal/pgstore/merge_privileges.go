package pgstore

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// upsertMayUpdate reports whether an Upsert of info can update target
// rows (see mergeShape.apply).
func upsertMayUpdate(info backfilltype.TableInfo) bool {
	return info.Target.Mode == backfilltype.Upsert && info.Target.Conflict != backfilltype.TargetWins && len(CompareColumns(info).Content) > 0
}

// prepareInsertOnly sets info.InsertOnly (and info.Role and
// info.NoUpdate) when info is an Upsert that may update rows and the
// session's role lacks UPDATE on a column an update writes.
func prepareInsertOnly(ctx context.Context, db sqlx.ExtContext, oid int64, info *backfilltype.TableInfo) error {
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
		oid, pq.Array(CompareColumns(*info).Written))
	if err != nil {
		return err
	}
	info.InsertOnly, info.Role = len(st.Missing) > 0, st.Role
	info.NoUpdate, info.NoUpdateAll = st.Missing, st.All
	return nil
}

// UpdateLacks names what UPDATE an insert-only Upsert (see above) lacks
// on the target: the table, and the columns when the role may update
// some of the written columns but not these; with the GRANT statement
// that gives it (column-level then).
func UpdateLacks(info backfilltype.TableInfo) (what, grant string) {
	t := sqlgen.Table(info.Target.Table)
	if info.NoUpdateAll || len(info.NoUpdate) == 0 {
		return t, GrantOn("UPDATE", "TABLE "+t, info.Role)
	}
	cols := sqlgen.List("", info.NoUpdate)
	return fmt.Sprintf("%s (columns %s)", t, cols), GrantOn("UPDATE ("+cols+")", "TABLE "+t, info.Role)
}

// insertOnlyRefused is the error of an insert-only Upsert (see above)
// whose chunk has n rows that would update target rows.
func insertOnlyRefused(info backfilltype.TableInfo, n int64) error {
	what, grant := UpdateLacks(info)
	return fmt.Errorf("backfill: merge %s: %w: %d rows would update existing rows, but role %s lacks UPDATE on %s; nothing of the chunk was written; "+
		"run %s as an administrator, then run the job again (it resumes)", info.Target.Table, backfilltype.ErrPrivilege, n, sqlgen.Ident(info.Role), what, grant)
}
