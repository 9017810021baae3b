// Package pgstore is the PostgreSQL store of backfill: the manifest
// (runs, chunks, leases, workers, control and knobs, throttle periods
// and configured watermarks, waits, status, the run report's data,
// privileges and the schema migrations), and the merger (staging by COPY, the merge SQL of each
// identity mode, key locks, refusals, fingerprints for skip-unchanged,
// the built-in checks' SQL and rollback from the undo log), the catalog
// checks of a target's privileges (PrivilegeChecker), and the SQL of the
// publish modes that create or swap tables (table versions, a view's
// source, partition swaps, the sessions holding a lock).
//
// It implements the contracts of package backfilldriver over
// database/sql through sqlx and lib/pq, and takes the executor on every
// call (sqlx.ExtContext), so the engine owns the chunk's transaction and
// the merge, undo log and checkpoint commit together. Package backfill
// builds it (backfill.New, backfill.NewPGManifest) and re-exports what
// users need; cmd/backfill uses it directly for the operator's commands.
package pgstore
