package backfill

import (
	"context"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Statements sent later, with the next one, to save a round trip each.
//
// A chunk's transaction runs statements that return nothing the library
// reads and that fail only when the transaction is already lost: its
// savepoints and their releases, the merge's planner settings and their
// restore. Each one alone is a round trip to the server. [pgstore.BatchTx]
// queues them ([pgstore.Later]) and sends them in front of the next
// statement without parameters, in one simple query (lib/pq runs a
// statement without parameters as a simple query, which may hold several
// statements; the result is the last one's, its affected rows included).
// Before any other statement (one with parameters, a query, the COPY's
// prepare) and before the commit, the queue is sent on its own, so the
// order of the statements on the server is the order the library issued
// them in. Nothing outlives the transaction: a rollback drops the queue
// with the rest.

// batched returns tx as a pgstore.BatchTx when it is a PostgreSQL transaction
// (one that can prepare statements: lib/pq's, possibly wrapped); another
// DB's (backfilltest's) as it is.
func batched(tx backfilldriver.Tx) backfilldriver.Tx {
	if _, ok := tx.(pgstore.Preparer); ok {
		return &pgstore.BatchTx{Tx: tx}
	}
	return tx
}

// beginChunk begins a chunk's transaction: on a connection of its own
// when the DB can ([pgstore.ChunkBeginner]), so that staging COPYs on
// lib/pq's connection ([pgstore.PGStager.CopyRows]).
func (ex *execution) beginChunk(ctx context.Context) (backfilldriver.Tx, error) {
	if cb, ok := ex.r.db.(pgstore.ChunkBeginner); ok {
		return cb.BeginChunk(ctx)
	}
	return ex.r.db.Begin(ctx)
}
