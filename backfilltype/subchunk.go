package backfilltype

import "time"

// Subchunk is one committed sub-range [Lo, Hi) of a plan chunk that an
// adaptive run (backfill.Config.ChunkTarget) split to keep each of its
// transactions near the target duration. The plan chunk itself is never
// changed: its sub-ranges tile it from its lower bound in Pos order, and
// it is done when the last one commits, with their summed counts.
type Subchunk struct {
	// Seq is the plan chunk's Seq.
	Seq int `db:"seq"`
	// Pos is the sub-range's 0-based position within its plan chunk.
	Pos int `db:"pos"`
	// Lo and Hi are the sub-range's bounds as text, as [Chunk.Bounds]
	// gives them (decimal for KindInt, RFC 3339 for KindTime).
	Lo string `db:"lo"`
	Hi string `db:"hi"`
	// Counts are the sub-range's rows, balanced.
	Counts
	// Split reports that the sub-range was cut from a larger one whose
	// transaction hit statement_timeout or waited for a lock beyond its
	// lock_timeout.
	Split bool `db:"split"`
	// Duration is the sub-range's transaction, from its begin to its
	// checkpoint (the commit's own time not included).
	Duration time.Duration `db:"-"`
	// Worker is the Config.WorkerID of the process that committed it.
	Worker string `db:"worker"`
	// CommittedAt is when its checkpoint was written.
	CommittedAt time.Time `db:"committed_at"`
}
