package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// Rows the target refuses at merge time.
//
// The staged rows of a chunk passed the row writer and the staging COPY,
// but the target can still refuse one when the merge writes it: a unique
// constraint or index other than the business key's (23505), a CHECK
// (23514), a foreign key (23503), a NOT NULL the staging table does not
// have (23502), a trigger that raises (P0001, or any error raised inside a
// PL/pgSQL function), an index row over the btree limit (54000, e.g. a
// 3,000-byte text key), or any other data error (class 22). One such row
// used to fail the whole chunk. Instead the merge runs inside a savepoint;
// when it fails with such an error (see pgStager.refusal), it is rolled
// back to the savepoint and the refused rows are found:
//
//  1. Set-based pre-checks over staging name suspects: rows whose values
//     of another plain unique index exist in the target on another
//     identity (one the chunk does not also write) or on an earlier
//     staged row; rows a CHECK constraint (on staged columns only)
//     evaluates to false; rows whose columns of a plain btree index
//     take more than the btree limit (2704 bytes at the default 8 kB
//     block size). A suspect is only a guess: it is merged alone, last,
//     and refused only when PostgreSQL refuses it.
//  2. The other rows are moved aside (a temporary table numbering them)
//     and merged by bisection: a range is staged and merged inside a
//     savepoint; when the target refuses a row of it, the range is rolled
//     back and its halves are merged in turn, down to single rows, which
//     are refused. A chunk with k refused rows out of n costs O(k log n)
//     statements over O(n log k) rows, never a retry of the chunk.
//
// A refused row goes to the exception queue (MergeResult.Rejected) with
// its row, the staged row as Raw, its identity as Value, and a Reason
// holding PostgreSQL's message, SQLSTATE, the constraint (or the trigger
// and its function) and the detail. The rest of the chunk merges, in row
// order, so that of two rows that collide on another unique constraint
// the first written wins, as it would have in an earlier chunk.
//
// Errors that are not about a row keep failing the chunk as before, to be
// retried when retryable: serialization failures and deadlocks (40xxx),
// lock timeouts (55P03), cancellation (57014), connection failures (08xxx),
// lack of resources (53xxx), a unique violation of the business key's own
// index (a concurrent insert of the same key).
//
// At most TableInfo.Chunk.MaxRefused rows ([Config.MaxMergeRefusals]) are
// refused per chunk; the next one fails the chunk with an error wrapping
// [ErrTooManyRejects] that names the row, its key, the constraint and
// PostgreSQL's message.
//
// A replay of the chunk refuses the same rows again: they are queued
// again under the new run's batch, counted as rejected, and the rest of
// the chunk is unchanged.

// DefaultMaxMergeRefusals is the default of [Config.MaxMergeRefusals].
const DefaultMaxMergeRefusals = pgstore.DefaultMaxMergeRefusals
