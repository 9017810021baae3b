package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// The SQL of the publish modes that create or swap tables
// (backfill.PublishVersionedView, backfill.PublishPartitionSwap): the
// names of the tables they create, the table a view reads, a partition's
// bounds and its swap, and the sessions that hold the locks a switch or
// a swap waits for. The root package's publishers decide when to call
// them, in which transaction, and what to record.

// QuoteLiteral returns s as a SQL string literal ([pq.QuoteLiteral]):
// quotes doubled, and the E'...' form with doubled backslashes when s has a
// backslash. Unlike the manifest's quoting of its schema name, it keeps
// invalid UTF-8 as it is.
func QuoteLiteral(s string) string { return pq.QuoteLiteral(s) }

// VersionTable names the table version a batch loads: "<table>__v<batch>"
// in the table's schema (table is a name [sqlgen.ParseTable] accepts; the
// result is in the same form). A name longer than PostgreSQL keeps (63
// bytes) is shortened by [sqlgen.Derived], which keeps "__v<batch>" whole:
// left to PostgreSQL's truncation, batch 10's version of a 59-byte table
// would be batch 1's table. Partition swap names its new partitions so too.
func VersionTable(table string, batchID int64) string {
	s, t := sqlgen.SplitTable(table)
	return sqlgen.Qualified(s, sqlgen.Derived(t, fmt.Sprintf("__v%d", batchID)))
}

// VersionMarker is the comment the versioned view's publisher puts on the
// version it creates for batchID of table ([VersionTable]), in the
// transaction that creates it: a table of that name without it (a user's
// table, or another derived name) is never merged into.
func VersionMarker(table string, batchID int64) string {
	return fmt.Sprintf("backfill: version of %s for batch %d", table, batchID)
}

// ViewSource returns the table (or partitioned table) the view reads, in
// the form of [sqlgen.Qualified], found from pg_depend and pg_rewrite
// (PostgreSQL docs 53.18 and 53.43); "" when the view does not exist yet.
// A view reading more than one table is an error, and so is the query's
// failure (wrapped, naming the view).
func ViewSource(ctx context.Context, db sqlx.ExtContext, view string) (string, error) {
	var src []string
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err := sqlx.SelectContext(ctx, db, &rels, `SELECT DISTINCT n.nspname, c.relname
		FROM pg_rewrite r
		JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.deptype = 'n'
		JOIN pg_class c ON c.oid = d.refobjid AND c.relkind IN ('r', 'p')
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE r.ev_class = to_regclass($1) AND d.refobjid <> r.ev_class`, sqlgen.Table(view))
	if err != nil {
		return "", fmt.Errorf("backfill: view %s: %w", view, err)
	}
	for _, r := range rels {
		src = append(src, sqlgen.Qualified(r.Schema, r.Name))
	}
	if len(src) > 1 {
		return "", fmt.Errorf("backfill: view %s reads %d tables %v; a versioned view reads one", view, len(src), src)
	}
	if len(src) == 0 {
		return "", nil
	}
	return src[0], nil
}

// WatchBlockers polls on db, every 10ms from another goroutine while
// session pid waits for a lock, the sessions that block it
// ([BlockingSessions]). The returned stop function must be called once:
// it ends the polling and describes the last blockers seen
// ([DescribeBlockers]; "" if none were). Polling also ends when ctx is
// done. Query errors count as no blockers.
func WatchBlockers(ctx context.Context, db sqlx.ExtContext, pid int) (stop func() string) {
	done := make(chan struct{})
	result := make(chan string, 1)
	go func() {
		last := ""
		defer func() { result <- last }()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s := DescribeBlockers(BlockingSessions(ctx, db, pid)); s != "" {
				last = s
			}
		}
	}()
	return func() string {
		close(done)
		return <-result
	}
}

// BlockingSessions returns the sessions that block session pid's lock
// wait now (pg_blocking_pids, PostgreSQL docs 9.27.1, joined to
// pg_stat_activity), in pid order, read in a read transaction of db
// ([Sessions]); nil for none or on error.
func BlockingSessions(ctx context.Context, db sqlx.ExtContext, pid int) []backfilltype.Blocker {
	return Sessions(ctx, db, `SELECT b.pid, coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state,
		coalesce(a.wait_event_type || ':' || a.wait_event, '') AS wait_event, '' AS mode, coalesce(a.query, '') AS query
		FROM unnest(pg_blocking_pids($1)) AS b(pid) JOIN pg_stat_activity a ON a.pid = b.pid ORDER BY b.pid`, pid)
}

// ConflictingHolders returns the other sessions that hold a lock on
// relation rel (in the form of backfill.Target.Table) in a mode that
// conflicts with ROW EXCLUSIVE (SHARE, SHARE ROW EXCLUSIVE, EXCLUSIVE,
// ACCESS EXCLUSIVE: PostgreSQL docs 13.3.1), with the mode, in pid order
// ([Sessions]); nil for none or on error.
func ConflictingHolders(ctx context.Context, db sqlx.ExtContext, rel string) []backfilltype.Blocker {
	return Sessions(ctx, db, `SELECT DISTINCT a.pid, coalesce(a.application_name, '') AS app,
		coalesce(a.state, '') AS state, '' AS wait_event, l.mode, coalesce(a.query, '') AS query
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
			AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
		ORDER BY a.pid`, sqlgen.Table(rel))
}

// LockHolders describes ([DescribeBlockers]) the other sessions that hold
// a lock on relation rel (pg_locks joined to pg_stat_activity, PostgreSQL
// docs 54.12 and 27.2.3): the sessions pg_blocking_pids would name for a
// waiter on an ACCESS EXCLUSIVE lock of rel. When it finds none (or the
// query fails) it returns "sessions that have since released it".
func LockHolders(ctx context.Context, db sqlx.ExtContext, rel string) string {
	s := DescribeBlockers(Sessions(ctx, db, `SELECT DISTINCT a.pid, coalesce(a.application_name, '') AS app,
		coalesce(a.state, '') AS state, '' AS wait_event, l.mode, coalesce(a.query, '') AS query
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
		ORDER BY a.pid`, sqlgen.Table(rel)))
	if s == "" {
		return "sessions that have since released it"
	}
	return s
}

// PartitionFor finds the partition of parent whose range bounds are the
// chunk's, by reading the bounds back from pg_get_expr(relpartbound) and
// casting them to the partition key's type, and returns its name (in the
// form of [sqlgen.Qualified]) and the key's SQL type. When db is not a
// transaction, it reads in one of its own ([ReadTx]). A list chunk is an
// error wrapping [backfilltype.ErrUnsupported]; a parent not partitioned
// by RANGE on one column, or without exactly one partition of the chunk's
// bounds, one wrapping [backfilltype.ErrInvalidConfig]; query errors are
// returned as they are.
func PartitionFor(ctx context.Context, db sqlx.ExtContext, parent string, c backfilltype.Chunk) (name, keyType string, err error) {
	ctx = WithPurpose(ctx, "find the chunk's partition", 0)
	err = ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		name, keyType, err = partitionForTx(ctx, tx, parent, c)
		return err
	})
	return name, keyType, err
}

func partitionForTx(ctx context.Context, db sqlx.ExtContext, parent string, c backfilltype.Chunk) (name, keyType string, err error) {
	var lo, hi any
	switch c.Kind {
	case backfilltype.KindTime:
		lo, hi = c.Start, c.End
	case backfilltype.KindInt:
		lo, hi = c.Lo, c.Hi
	default:
		return "", "", fmt.Errorf("backfill: partition swap: %w: list chunks have no range partition", backfilltype.ErrUnsupported)
	}
	var keyTypes []string
	if err := sqlx.SelectContext(ctx, db, &keyTypes, `SELECT format_type(a.atttypid, a.atttypmod)
		FROM pg_partitioned_table p JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
		WHERE p.partrelid = to_regclass($1) AND p.partstrat = 'r' AND p.partnatts = 1`, sqlgen.Table(parent)); err != nil {
		return "", "", err
	}
	if len(keyTypes) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s is not partitioned by RANGE on one column", backfilltype.ErrInvalidConfig, parent)
	}
	keyType = keyTypes[0]
	var rels []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err = sqlx.SelectContext(ctx, db, &rels, fmt.Sprintf(`SELECT n.nspname, c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace,
		LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''(.*)''\) TO \(''(.*)''\)$') m
		WHERE i.inhparent = to_regclass($1) AND m IS NOT NULL AND m[1]::%[1]s = $2::%[1]s AND m[2]::%[1]s = $3::%[1]s`, keyType),
		sqlgen.Table(parent), lo, hi)
	if err != nil {
		return "", "", err
	}
	var names []string
	for _, r := range rels {
		names = append(names, sqlgen.Qualified(r.Schema, r.Name))
	}
	if len(names) != 1 {
		return "", "", fmt.Errorf("backfill: partition swap: %w: %s has no partition for exactly %s", backfilltype.ErrInvalidConfig, parent, c)
	}
	return names[0], keyType, nil
}

// SwapParams are the inputs of [SwapPartition] besides its transaction.
type SwapParams struct {
	// Parent is the partitioned table's name, unquoted (sqlgen.Table
	// quotes it).
	Parent string
	// Part is the partition attached now, to detach, named as Parent.
	Part string
	// Next is the table to attach in its place.
	Next string
	// Col is the partition key column.
	Col string
	// KeyType is the key column's SQL type, e.g. "bigint".
	KeyType string
	// Chunk is the chunk whose bounds are the partition's.
	Chunk backfilltype.Chunk
	// LockTimeout is PostgreSQL's lock_timeout for the swap, e.g. "5s".
	LockTimeout string
}

// SwapPartition attaches p.Next in place of p.Part, in tx (a transaction:
// the swap's statements commit or roll back with it). It formats the
// chunk's bounds as a CHECK constraint on p.Next, so that ATTACH skips
// its scan, and as the partition bounds; then it sets lock_timeout
// (local to tx), adds the constraint, detaches p.Part, attaches p.Next
// and drops the constraint, in that order. An error of the bounds'
// queries is returned as it is; an error of the swap's statements is
// wrapped, naming p.Part.
func SwapPartition(ctx context.Context, tx sqlx.ExtContext, p SwapParams) error {
	lo, hi := any(p.Chunk.Lo), any(p.Chunk.Hi)
	if p.Chunk.Kind == backfilltype.KindTime {
		lo, hi = p.Chunk.Start, p.Chunk.End
	}
	q := sqlgen.Ident(p.Col)
	// A CHECK constraint matching the bounds lets ATTACH skip its scan.
	var check string
	if err := sqlx.GetContext(ctx, tx, &check, fmt.Sprintf(`SELECT format('%%s IS NOT NULL AND %%s >= %%L::%[2]s AND %%s < %%L::%[2]s', %[1]s, %[1]s, $1::%[2]s, %[1]s, $2::%[2]s)`,
		QuoteLiteral(q), p.KeyType), lo, hi); err != nil {
		return err
	}
	var bounds string
	if err := sqlx.GetContext(ctx, tx, &bounds, fmt.Sprintf(`SELECT format('FROM (%%L) TO (%%L)', $1::%[1]s, $2::%[1]s)`, p.KeyType), lo, hi); err != nil {
		return err
	}
	stmts := []string{
		`SELECT set_config('lock_timeout', ` + QuoteLiteral(p.LockTimeout) + `, true)`,
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT backfill_bounds CHECK (%s)`, sqlgen.Table(p.Next), check),
		fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, sqlgen.Table(p.Parent), sqlgen.Table(p.Part)),
		fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES %s`, sqlgen.Table(p.Parent), sqlgen.Table(p.Next), bounds),
		fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT backfill_bounds`, sqlgen.Table(p.Next)),
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("backfill: partition swap of %s: %w", p.Part, err)
		}
	}
	return nil
}
