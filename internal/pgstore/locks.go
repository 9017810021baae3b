package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Sessions runs q (columns pid, app, state, wait_event, mode, query) in
// a read transaction and returns its sessions, nil on error.
func Sessions(ctx context.Context, db sqlx.ExtContext, q string, args ...any) []backfilltype.Blocker {
	ctx = WithPurpose(ctx, "list blocking sessions", 0)
	var rows []backfilltype.Blocker
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil // a retried attempt starts over
		return sqlx.SelectContext(ctx, tx, &rows, q, args...)
	})
	if err != nil {
		return nil
	}
	for i := range rows {
		if len(rows[i].Query) > 200 {
			rows[i].Query = ValidPrefix(rows[i].Query, 200) + "..."
		}
	}
	return rows
}

// DescribeBlockers describes sessions in one line, "" for none.
func DescribeBlockers(bs []backfilltype.Blocker) string {
	parts := make([]string, len(bs))
	for i, h := range bs {
		// The fields PostgreSQL left empty (the state of another role's
		// session without pg_read_all_stats, a holder with no mode) are
		// left out.
		fields := []string{fmt.Sprintf("application_name %q", h.ApplicationName)}
		if h.State != "" {
			s := h.State
			if h.WaitEvent != "" && h.State == "active" {
				s += ", waiting on " + h.WaitEvent
			}
			fields = append(fields, s)
		}
		if h.Mode != "" {
			fields = append(fields, "holding "+h.Mode)
		}
		fields = append(fields, fmt.Sprintf("query %q", h.Query))
		parts[i] = fmt.Sprintf("pid %d (%s)", h.PID, strings.Join(fields, ", "))
	}
	return strings.Join(parts, ", ")
}

// StrongLockHolders returns the other sessions that hold a lock on a
// relation in a mode that conflicts with the row locks and ROW EXCLUSIVE
// the library takes (SHARE and stronger), with the mode; nil for none or
// on error. After a lock timeout the blocker is no longer a waiter's
// pg_blocking_pids: these are the likely ones. Each Mode names the
// relation ("AccessExclusiveLock on backfill.chunks").
func StrongLockHolders(ctx context.Context, db sqlx.ExtContext) []backfilltype.Blocker {
	return Sessions(ctx, db, `SELECT DISTINCT a.pid, coalesce(a.application_name, '') AS app,
		coalesce(a.state, '') AS state, '' AS wait_event, l.mode || ' on ' || l.relation::regclass::text AS mode, coalesce(a.query, '') AS query
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND l.granted AND l.pid <> pg_backend_pid()
			AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
		ORDER BY a.pid`)
}
