package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
)

// Replays that skip unchanged chunks (issue 15): design, and the two
// fingerprints it rests on. Not wired into a run yet: nothing here changes
// what a run does.
//
// A replay (Job.NewRun over a loaded range, or a restatement in which few
// chunks changed) extracts, converts, stages and merges every chunk,
// although most write nothing: the COPY and the merge's comparison are
// about all of its cost. The extraction and conversion cannot be skipped
// (the source is only known by reading it); staging and merge can, when
// two facts hold:
//
//  1. the chunk's converted source rows are the same multiset as at the
//     last successful load of the same chunk (same job, chunk ID, target,
//     written columns and plan fingerprint): sourceFingerprint, computed
//     by the row writer from the values it stages, in Go, no round trip;
//  2. the chunk's target rows are what that load's merge left:
//     targetFingerprint, the multiset hash of the target rows within the
//     chunk's ChunkColumn bounds (validate_fingerprint.go's SQL, one scan
//     of the chunk's rows through the ChunkColumn index, no join, no
//     write), taken in the chunk's transaction after the merge at load and
//     again at the replay, under the chunk's lock.
//
// When both match, the merge would find every row unchanged: the chunk is
// checkpointed with read = unchanged + rejected (the rejected rows are
// queued again for the new batch, as a merge would have), inserted =
// updated = deduplicated = 0, so the accounting balances. A changed
// source row changes (1); a target row changed, deleted or added inside
// the bounds by anyone changes (2); either way the chunk is staged and
// merged as today. The comparison is probabilistic like the validation
// fingerprints (a 2^-64-class collision, and the timestamp hash weakness
// documented in validate_fingerprint.go); a Job option, off by default,
// turns it on.
//
// The wiring left to do, and the choices it makes:
//
//   - Eligibility: ChunkColumn set (the target side needs bounds; without
//     them the chunk's target rows are only known through staging, which
//     is what skipping saves), direct publish mode (not deferred), not
//     History or Keyless, every column hashable (hashKind), no validators
//     that need staging, the default merger. Otherwise the chunk loads as
//     today.
//   - Staging must wait for (1): the row writer puts the rows into the
//     spool (backfill_spool.go, as the leased path does) while summing
//     sourceFingerprint; at the end of the extraction a match checks (2)
//     and skips, a mismatch replays the spool into COPY. A skipped chunk
//     costs the extraction, the conversion, one hash per row and one
//     indexed read of its rows: no COPY, no merge, no WAL but the manifest
//     row.
//   - Storage: migration 19 adds to the manifest's chunk rows the source
//     fingerprint, the target fingerprint after the merge and the columns
//     they cover, written in the chunk's checkpoint statement (the chunk's
//     transaction: a kill -9 loses both or neither). The replay looks up
//     the newest done, not rolled back, row of the same job and chunk ID.
//   - Rollback: a skipped chunk writes no target row, no lineage and no
//     undo entry, so a rollback of the replay batch deletes nothing the
//     earlier batch wrote. It delivered every row of its bounds unchanged:
//     it records the delivered summary (rollback_delivered.go) from the
//     target rows in its bounds (owner = lineage UpdatedBy, count, least
//     and greatest identity), as its merge would have, so that a rollback
//     of the earlier batch still reports them. Rolling the earlier batch
//     back changes the target rows, so the next replay's (2) no longer
//     matches: nothing skips on a rolled-back base.

// chunkFingerprint is an order-independent (multiset) hash of rows: their
// count and two 64-bit lanes, each the sum modulo 2^64 of a lane of each
// row's SHA-256. A sum, unlike XOR, does not cancel equal rows.
type chunkFingerprint struct {
	Rows int64
	Sum  [2]uint64
}

// add adds one converted row: the written columns of info, as
// convertValue returns them (values[:info.Written]).
func (f *chunkFingerprint) add(info TableInfo, values []any) {
	sum := sourceRowHash(info, values)
	f.Rows++
	f.Sum[0] += binary.BigEndian.Uint64(sum[0:8])
	f.Sum[1] += binary.BigEndian.Uint64(sum[8:16])
}

// String renders the fingerprint for the manifest: rows:lane0:lane1 in
// hexadecimal, e.g. "3:1f…:a2…".
func (f chunkFingerprint) String() string {
	return fmt.Sprintf("%d:%016x:%016x", f.Rows, f.Sum[0], f.Sum[1])
}

// sourceRowHash returns the SHA-256 of every written column of a
// converted row, key columns included, in column order; each column
// contributes its position, a NULL marker, and for non-NULL values the
// canonical form of rowHash (merge_hash.go): values the merge finds equal
// hash alike (numeric 1.0 and 1.00, one instant in two zones).
func sourceRowHash(info TableInfo, values []any) [sha256.Size]byte {
	h := sha256.New()
	var buf [8]byte
	for i, col := range info.Columns[:info.Written] {
		binary.BigEndian.PutUint64(buf[:], uint64(i))
		h.Write(buf[:])
		v := values[i]
		if v == nil {
			h.Write([]byte{0})
			continue
		}
		family, text := canonical(col, v)
		h.Write([]byte{1, family})
		binary.BigEndian.PutUint64(buf[:], uint64(len(text)))
		h.Write(buf[:])
		h.Write([]byte(text))
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// targetFingerprint returns the multiset hash of chunk c's target rows:
// the rows of info's target whose chunkColumn lies within c's bounds (zone
// for a timestamp or date column, nil for UTC), over every column of info
// (identity first), computed by the server in tx without writing. It
// returns an error wrapping [ErrUnsupported] when a column has no
// fingerprint (hashKind) or chunkColumn is "", and the query's error.
func targetFingerprint(ctx context.Context, tx sqlx.ExtContext, info TableInfo, chunkColumn string, zone *time.Location, c Chunk) (fingerprint, error) {
	if chunkColumn == "" {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: no ChunkColumn bounds the chunk's target rows", c.ID, ErrUnsupported)
	}
	// Staging is never read: the check only builds the target's query.
	pc, err := newPGCheck("target fingerprint", SeverityError, ValidationScope{Chunk: c, Info: info, ChunkColumn: chunkColumn, Zone: zone, Staging: "-"})
	if err != nil {
		return fingerprint{}, err
	}
	cols := info.identity()
	for _, col := range info.Columns {
		if !slices.Contains(cols, col.Name) {
			cols = append(cols, col.Name)
		}
	}
	for _, n := range cols {
		if col := pc.cols[n]; hashKind(col) == "" {
			return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: column %q of type %s has none", c.ID, ErrUnsupported, n, cmpOr(col.Type, col.BaseType))
		}
	}
	if _, ok := pc.cols[chunkColumn]; !ok {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: ChunkColumn %q is not a column of the target", c.ID, ErrInvalidConfig, chunkColumn)
	}
	var a sqlArgs
	bounds, err := pc.inChunk("t", &a)
	if err != nil {
		return fingerprint{}, err
	}
	q := pc.fingerprintTargetSQL(cols, bounds)
	// The text forms the hash reads depend on these settings: pinned for
	// the statement, restored at its end (set_config(..., true) lasts to
	// the end of the transaction, so a savepoint scopes it).
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_target_fingerprint`); err != nil {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: savepoint: %w", c.ID, err)
	}
	var fp fingerprint
	qerr := func() error {
		if _, err := tx.ExecContext(ctx, pinnedSettings); err != nil {
			return err
		}
		return sqlx.GetContext(ctx, tx, &fp, q, a...)
	}()
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_target_fingerprint; RELEASE SAVEPOINT backfill_target_fingerprint`); err != nil {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: rollback to savepoint: %w", c.ID, err)
	}
	if qerr != nil {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w", c.ID, qerr)
	}
	return fp, nil
}
