package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// PGMerger is the PostgreSQL [Merger].
//
// Staging is a temporary table per connection and target shape, created
// with ON COMMIT DELETE ROWS (PostgreSQL docs, CREATE TABLE, "ON COMMIT"),
// filled with COPY FROM STDIN. The merge is set-based and writes only what
// changed: duplicates inside the chunk are deleted from staging by the
// Target.Duplicates rule, then
//
//	UPDATE target t SET ... FROM staging s WHERE <key equal> AND (t.cols) IS DISTINCT FROM (s.cols)
//	INSERT INTO target SELECT ... FROM staging s WHERE NOT EXISTS (<same key in target>)
//
// so replaying an identical chunk rewrites, locks and WAL-logs no target
// row (unlike INSERT ... ON CONFLICT DO UPDATE ... WHERE, which locks every
// conflicting row). A concurrent insert of the same key by another
// transaction makes the INSERT fail with unique_violation, which
// [IsRetryable] reports as retryable: the retried chunk then sees the row.
//
// Upsert has a fast path for loads into new ground: when the previous
// chunk merged into the same table (by this merger) inserted every row, the
// next chunk is first tried as a plain INSERT ... SELECT inside a
// savepoint, which skips the per-row lookup; a unique violation rolls back
// to the savepoint and the chunk takes the general path, which it then
// keeps until a chunk is again all inserts. A replay or an overlapping
// load never takes the fast path twice in a row.
type PGMerger = pgstore.Merger

// NewPGMerger returns the PostgreSQL merger. It is safe for concurrent use.
func NewPGMerger() *PGMerger {
	return pgstore.NewMerger()
}
