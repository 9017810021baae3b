package backfilldriver

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ManifestSubchunks is implemented by manifests that record the
// sub-ranges of plan chunks an adaptive run (backfill.Config.ChunkTarget)
// commits one transaction each. backfill.PGManifest and backfilltest's
// Manifest do. A Runner whose Manifest lacks it runs every chunk whole
// (and says so in its log once).
type ManifestSubchunks interface {
	// Subchunks returns the sub-ranges of plan chunk seq of batchID
	// committed so far, in Pos order, read in db (the chunk's
	// transaction, or none). A chunk that was never split has none.
	Subchunks(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int) ([]backfilltype.Subchunk, error)
	// CompleteSubchunk records sub-range s of plan chunk s.Seq (whose ID
	// is chunkID), in tx, the sub-range's transaction, which holds the
	// chunk's fence ([ManifestLeases.FenceLease], which took the lease);
	// exceptions are queued under chunkID. The chunk stays pending and
	// its lease is given back to leaseKey at the fence's epoch, in tx, so
	// that the holder fences its next sub-range's transaction with the
	// same lease. It returns an error wrapping
	// [backfilltype.ErrAccounting] when s.Counts are not balanced, and an
	// error when the chunk is not pending (or its run ended) or s.Pos is
	// already recorded: the caller rolls back.
	CompleteSubchunk(ctx context.Context, tx sqlx.ExtContext, batchID int64, chunkID, leaseKey string, s backfilltype.Subchunk, exceptions []backfilltype.Exception) error
}
