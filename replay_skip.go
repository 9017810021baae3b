package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Replays that skip unchanged chunks (issue 15, [Job.SkipUnchanged]):
// design, and the two fingerprints it rests on. The wiring is in
// replay_skip_run.go (eligibility, the decision, the skipped chunk's
// checkpoint), manifest_skip.go (storage, [ManifestSkips]) and the two
// run paths (runChunk, runChunkLeased), which call it.
//
// A replay (Job.NewRun over a loaded range, or a restatement in which few
// chunks changed) extracts, converts, stages and merges every chunk,
// although most write nothing: the COPY and the merge's comparison are
// about all of its cost. The extraction and conversion cannot be skipped
// (the source is only known by reading it), unless the extractor tells a
// version of the chunk's source (ChunkVersioner, replay_skip_version.go);
// staging and merge can, when two facts hold:
//
//  1. the chunk's converted source rows are the same multiset as at the
//     last successful load of the same chunk (same job, chunk ID and
//     skip key, below): chunkFingerprint, summed by
//     a fingerprintAdder between the row writer and its spool, in Go, no
//     round trip;
//  2. the chunk's target rows are a state a merge of those source rows
//     leaves as it is: targetFingerprint, the multiset hash of the
//     target rows within the chunk's ChunkColumn bounds (one scan of
//     the chunk's rows through the ChunkColumn index, no write): on a
//     heap target of their row versions' identities (table, ctid,
//     xmin: tupleHashSQL, which reads no value, so its cost does not
//     grow with the row's width), otherwise of their values
//     (validate_fingerprint.go's SQL); taken in the chunk's
//     transaction after the merge at load (targetFingerprintMerged, which
//     proves that state in the same statement, below) and again at the
//     replay (no join), after the claim (or the lease's fence), which
//     holds the chunk's row lock. A job without ChunkColumn has no
//     bounds: its chunk's target rows are those of the chunk's
//     identities, from the staging table at load
//     (targetFingerprintMerged), from the spool's keys sent as text
//     arrays at the replay (targetFingerprintKeys: unnest, one index
//     probe per row). A row of another key is left out, rightly: the
//     merge would not touch it.
//
// When both match, the merge would find every row unchanged: the chunk is
// checkpointed with read = unchanged + rejected, inserted = updated =
// deduplicated = 0, so the accounting balances. The rejected rows are the
// replay's own: the row writer converts every row as always, and its
// rejects go to the new batch's exception queue, as a merged chunk's do.
// A changed source row changes (1); a target row changed, deleted or
// added inside the bounds by anyone changes (2); either way the chunk is
// staged (the spool replayed into COPY) and merged as today. The
// comparison is probabilistic like the validation fingerprints (a
// 2^-64-class collision, and the timestamp hash weakness documented in
// validate_fingerprint.go). A skipped chunk writes nothing to the target,
// so a concurrent writer of its rows is ordered after it: the recorded
// fingerprint is the one it read, and the next replay sees the change.
//
// The choices:
//
//   - Recording (recordAfterMerge): a merged chunk records the two
//     fingerprints only when its merge took every staged row (no merge
//     rejects, no deduplication; eligibility rules out other conflict
//     policies and Version), the source fingerprint counts the staged
//     rows (no value was isolated while staging), and the statement
//     that takes the target fingerprint counts as many rows and, in the
//     same snapshot, none that lacks a staged row of its identity or
//     differs from it in a Checked column (a superset of those the merge
//     compares; a LEFT JOIN to the stager's staging table, StagingTabler:
//     without one nothing is recorded). The merge's result alone would
//     not do: it does not lock the target rows it leaves unchanged, and
//     under READ COMMITTED another session may change one and commit
//     between the merge's statement and the fingerprint's, which would
//     then record a state the merge would change (SourceWins restores
//     the source's row), and a replay of the same source would skip and
//     keep it (TestSkipUnchangedRecordsOnlyWhatAMergeLeaves). The
//     recorded state is then proven to be the chunk's rows as merged, so
//     a later merge of the same staged rows against the same target rows
//     is determined: it changes nothing. Otherwise nothing is recorded
//     (NULL) and the next replay merges. A skipped chunk records its
//     base's fingerprints again: it is the next replay's base, and the
//     pair stays proven (the replay's own fingerprint statement found the
//     target in the base's state; a change after it changes the next
//     replay's fingerprint).
//   - Eligibility (skipEligible, at plan time, before any work; a job
//     that asked for it and can never skip is refused with
//     ErrInvalidConfig naming the reason, a Runner without ManifestSkips
//     or PGMerger with ErrUnsupported): Upsert or
//     AppendOnly, SourceWins without Version, PublishPerChunk, every
//     column hashable (hashKind), validators among those proven by the
//     fingerprints (below) and CheckExceptionRate. At run time a chunk
//     read again while open, or open now, is never skipped (ChunkOpen
//     re-reads combine their counts).
//   - Validators (skipValidators): those that compare staging with the
//     target (Completeness, Aggregates, ReplayChangesNothing, Sample,
//     DuplicateKeys without AcrossTarget) pass by construction for a
//     skipped chunk (its target rows are proven the merged ones); they
//     record a passed result whose Detail says so (skipped, the base
//     batch and fingerprints) instead of running. CheckExceptionRate
//     runs on the skipped chunk's counts. ReferentialIntegrity (its
//     parent table may have changed), DuplicateKeys across the target
//     and validators of the caller's are not proven: such jobs are
//     refused.
//   - Jobs without ChunkColumn (benchload's end-to-end job among them):
//     see (2). The identities are rendered as the text COPY would send
//     (spoolKeyText); a value rendered otherwise matches no row, so the
//     count differs and the chunk merges, never a wrong skip. Their
//     delivered summary joins the same arrays.
//   - Spool, then decide: the row writer puts the rows into the spool
//     (backfill_spool.go, bounded memory) behind the fingerprintAdder:
//     runChunkLeased spools always (outside any transaction), runChunk
//     spools when the option is on (inside the chunk's transaction, as
//     it extracts today). In the chunk's transaction, after the publish
//     mode's target, skipUnchanged looks the base up and compares; a
//     mismatch replays the spool into COPY (loadChunk, stage).
//   - The skip key (Plan.skipKey): what a base must share with the
//     replay besides the job and the chunk ID (which names the chunk's
//     bounds), so that its merge of the same rows is determined the same
//     way. It hashes the plan without its scope and chunk list: source,
//     code version, target table, key, written columns, mode, duplicate
//     and conflict policies, version, validity columns, derived keys,
//     hash column, lineage columns, rollback mechanism, publish mode and
//     time declarations (zone, ChunkColumn, date meaning, event,
//     modified and ingestion times), all conservatively, and the
//     declared type and collation of every target column (a widened
//     numeric(10,2) -> (10,3) stores the same source value otherwise,
//     though the rows hash alike). Not the plan fingerprint, which
//     covers the scope and every chunk ID: a replay of part of a loaded
//     range, or of a range extended by new chunks, finds the loaded
//     chunks' bases. The validators are not in it: eligibility admits
//     only those the fingerprints prove.
//   - Storage: migration 19 adds to the manifest's chunk rows the two
//     fingerprints (text: chunkFingerprint.String, and the target's rows
//     and sum), the skip key and the skipped marker, written by the
//     chunk's checkpoint statement in the chunk's transaction: a kill -9
//     loses all or none. The skip key is recorded by every checkpoint of
//     a job with the option, with or without fingerprints, so the newest
//     chunk of the key is the base, never an older one. The lookup
//     (ManifestSkips.BaseFingerprints) is one statement per chunk, in the
//     chunk's transaction, only with the option: the newest done row of
//     the same job, chunk ID and skip key in another batch whose run is
//     not rolled back (a rolled back chunk is not done). With the option
//     off a chunk's round trips are unchanged (the checkpoint statement
//     sets the columns NULL, skipped false).
//   - Visibility: the skipped marker (chunks.skipped, ChunkState.Skipped)
//     is what Report.ChunksSkipped (chunkSummary's aggregate),
//     StatusChunks.Skipped (run_progress.chunks_skipped, the view
//     replaced by migration 19 with one more column), the run report and
//     the command line count: the batch's skipped chunks, across the
//     calls and processes that worked it, a resume after a kill -9
//     included.
//   - Rollback: a skipped chunk writes no target row, no lineage and no
//     undo entry, so a rollback of the replay batch deletes nothing the
//     earlier batch wrote. It delivered every row of its bounds unchanged:
//     it records the delivered summary (rollback_delivered.go) from the
//     target rows in its bounds (owner = lineage UpdatedBy, count, least
//     and greatest identity; recordSkippedDelivered), as its merge would
//     have, so that a rollback of the earlier batch still reports them.
//     Rolling the earlier batch back changes the target rows, so the next
//     replay's (2) no longer matches: nothing skips on a rolled-back base.
//   - Cost (BenchmarkTargetFingerprint, 10,000-row chunks, shared 2-core
//     machine): the target re-check 17-20 ms, a skipped chunk's
//     extraction, conversion, fingerprints and re-check 31-61 ms, today's
//     replay of the chunk 207-228 ms. Where a skipped chunk's time goes
//     (benchload -skip -skip-profile, an unchanged replay of 1,000,000
//     rows): on the client, of its CPU, the extractor's own row
//     generation 29%, Write's conversion and checks 28%, the source
//     fingerprint 15% (encoding and SHA-256 about half each), the spool
//     5%; on the server, the target fingerprint 93% of the statements'
//     time (about 2 ms of its 5-6 ms per 10,000 rows the index scan, the
//     rest hashing), the manifest's statements the rest. BenchmarkSkipRow
//     splits a row's client cost (Write, spool, fingerprint). The row
//     encoding of version 2 (sourceEncodingVersion: varints, uvarint
//     lengths) makes benchload's order line 99 bytes instead of about
//     150, two SHA-256 blocks instead of three. The replay's fingerprint
//     statement runs without a savepoint and pinned settings when its
//     hash reads none (pinnedFingerprint): 15 round trips per skipped
//     chunk instead of 18 (TestSkippedChunkRoundTrips).
//     A merged chunk of a job with the option pays the base look-up and
//     the fingerprint it records, one more scan of its target rows joined
//     to staging (BenchmarkTargetFingerprint/merged-fingerprint: 12-13 ms
//     against the plain fingerprint's 5-7 ms; with the hash and merge
//     joins the merge leaves off, the join was a nested loop of 2.1 s).

// chunkFingerprint is an order-independent (multiset) hash of rows: their
// count and two 64-bit lanes, each the sum modulo 2^64 of a lane of each
// row's SHA-256 (of encodeSourceRow's encoding). A sum, unlike XOR, does
// not cancel equal rows. buf is the reused encoding of a row: adding a
// row allocates nothing.
type chunkFingerprint struct {
	Rows int64
	Sum  [2]uint64
	buf  []byte
}

// sourceEncodingVersion names encodeSourceRow's encoding in a recorded
// source fingerprint (String), so that a fingerprint recorded under
// another encoding never compares equal to one of this encoding: the
// chunk is merged once, and records this encoding's. Version 1 (no tag,
// fixed-width lengths and integers) was recorded before it.
const sourceEncodingVersion = "v2"

// add adds one converted row: the values of cols (the written columns),
// as convertValue returns them.
func (f *chunkFingerprint) add(cols []Column, values []any) {
	f.buf = encodeSourceRow(f.buf[:0], cols, values)
	sum := sha256.Sum256(f.buf)
	f.Rows++
	f.Sum[0] += binary.BigEndian.Uint64(sum[0:8])
	f.Sum[1] += binary.BigEndian.Uint64(sum[8:16])
}

// String renders the fingerprint for the manifest: the encoding version,
// then rows:lane0:lane1 in hexadecimal, e.g. "v2:3:1f…:a2…".
func (f chunkFingerprint) String() string {
	return fmt.Sprintf("%s:%d:%016x:%016x", sourceEncodingVersion, f.Rows, f.Sum[0], f.Sum[1])
}

// Tags of encodeSourceRow: one byte before each value, its type (and a
// bool's value), so that values of different types or NULL never encode
// alike.
const (
	srcNull  byte = 0
	srcInt   byte = 'i'
	srcFloat byte = 'f'
	srcFalse byte = 'b'
	srcTrue  byte = 'B'
	srcText  byte = 's'
	srcBytes byte = 'y'
	srcTime  byte = 't'
	srcOther byte = '?'
)

// encodeSourceRow appends to buf an unambiguous encoding of the values of
// cols (the written columns) of a converted row, key columns included,
// in column order (the
// encoding of sourceEncodingVersion): per column a tag (NULL, or the
// value's type), then the value: integers as varints, floats as their 8
// bytes, strings and byte slices uvarint-length-prefixed, a time as the
// varints of its Unix seconds, nanoseconds and zone offset. Every part is
// self-delimiting, so a row decodes in one way: two rows encode alike
// only when their values are equal, of the same types, NULLs in the same
// columns (an empty string is not NULL). The encoding is of the values as
// converted, not canonical: a value written in another form (numeric text
// 1.0 where the last load had 1.00, a time in another zone) encodes
// differently, so the chunk counts as changed and is merged, which is
// safe; the same extractor writing the same data encodes alike.
func encodeSourceRow(buf []byte, cols []Column, values []any) []byte {
	for i := range cols {
		switch x := values[i].(type) {
		case nil:
			buf = append(buf, srcNull)
		case int64:
			buf = binary.AppendVarint(append(buf, srcInt), x)
		case float64:
			buf = binary.BigEndian.AppendUint64(append(buf, srcFloat), math.Float64bits(x))
		case bool:
			if x {
				buf = append(buf, srcTrue)
			} else {
				buf = append(buf, srcFalse)
			}
		case string:
			buf = binary.AppendUvarint(append(buf, srcText), uint64(len(x)))
			buf = append(buf, x...)
		case []byte:
			buf = binary.AppendUvarint(append(buf, srcBytes), uint64(len(x)))
			buf = append(buf, x...)
		case time.Time:
			// Seconds and nanoseconds apart: UnixNano wraps outside the
			// years 1678 to 2262, where two instants would encode alike.
			_, off := x.Zone()
			buf = binary.AppendVarint(append(buf, srcTime), x.Unix())
			buf = binary.AppendUvarint(buf, uint64(x.Nanosecond()))
			buf = binary.AppendVarint(buf, int64(off))
		default:
			family, text := canonical(cols[i], x)
			buf = binary.AppendUvarint(append(buf, srcOther, family), uint64(len(text)))
			buf = append(buf, text...)
		}
	}
	return buf
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
	pc, cols, err := targetFingerprintCheck(info, ValidationScope{Chunk: c, Info: info, ChunkColumn: chunkColumn, Zone: zone, Staging: "-"})
	if err != nil {
		return fingerprint{}, err
	}
	if _, ok := pc.cols[chunkColumn]; !ok {
		return fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: ChunkColumn %q is not a column of the target", c.ID, ErrInvalidConfig, chunkColumn)
	}
	var a sqlArgs
	bounds, err := pc.inChunk("t", &a)
	if err != nil {
		return fingerprint{}, err
	}
	// A list chunk's bound is its item's text, which the server reads as
	// the ChunkColumn's type (under DateStyle and TimeZone for a time);
	// an int chunk's are numbers and a time chunk's instants with their
	// offsets (inChunk), read alike under any setting.
	if info.tupleIdentity {
		q := fingerprintSQL(info, cols, pc.target, pc.target+" t WHERE "+bounds, "", &a)
		return pinnedFingerprint(ctx, tx, c, q, a, c.Kind == KindList)
	}
	return pinnedFingerprint(ctx, tx, c, pc.fingerprintTargetSQL(cols, bounds), a, c.Kind == KindList || hashReadsSettings(pc, cols))
}

// tupleHashSQL is the hash of the tuple identity of the target row of
// alias: its table (a partition's own), its place (ctid) and the
// transaction that wrote it (xmin). The heap never changes a row version
// in place: an UPDATE writes a new version at another ctid with its own
// xmin, a DELETE removes one (the count drops), an INSERT adds one. So
// the rows of a chunk whose identities are the same multiset as at the
// last load are the same row versions, byte for byte, whatever their
// width: the target side of a skip is checked without reading a value
// (issue 15). Freezing keeps the raw xmin (PostgreSQL 9.4 and later); a
// rewrite (VACUUM FULL, CLUSTER, a column type change) moves every row,
// and the chunk then merges once (writing nothing) and records the new
// identities. What it does not see: a row version left behind at a
// ctid and reused by one whose writer's 32-bit xid equals the first's,
// which takes about 2^32 transactions between the two loads; and target
// tables other than heap ones, whose fingerprints hash values
// (TableInfo.tupleIdentity is false for them).
func tupleHashSQL(alias string) string {
	return fmt.Sprintf("hashtidextended(%[1]s.ctid, hashtextextended(%[1]s.xmin::text, %[1]s.tableoid::int8))", alias)
}

// tupleShapeSQL is, for the target named target (quoted, its name bound
// in a), a short hash of its shape: each column's place, name and type
// (attnum, attname, atttypid, atttypmod) in the target and in each
// partition among oids (an SQL array of the partitions holding the
// chunk's rows, "" for none), and each one's kind and access method. Row
// versions read as other values, without a write, when a column is
// dropped and added again (its values NULL or a constant default), two
// columns' names are swapped, or the same is done to a partition
// detached and attached again: the shape then differs. A partition
// holding none of the chunk's rows (one created ahead, or dropped) does
// not change it. It is read by the fingerprint's own statement, in the
// chunk's transaction, so a change between two chunks of one run counts
// too. Under READ COMMITTED that statement's snapshot is taken after
// its locks, which an ALTER TABLE conflicts with: the rows and the shape
// it reads are of one state. Under REPEATABLE READ or SERIALIZABLE (a
// DB whose Begin starts one) the catalog it reads may predate a change
// the rows are read through: Run then hashes values instead
// (Runner.readCommitted), and should one such transaction still come
// here, the shape is its own (a token no other fingerprint holds), so
// the chunk merges.
func tupleShapeSQL(target, oids string, a *sqlArgs) string {
	rel := a.bind(target) + "::regclass"
	in := "r.oid = " + rel
	if oids != "" {
		in += " OR r.oid = ANY (" + oids + ")"
	}
	return sqlf(`CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN
	(SELECT left(md5(string_agg(format('%s.%s.%s.%s.%s.%s.%s', r.oid, r.relkind, r.relam, a.attnum, a.attname, a.atttypid, a.atttypmod), ',' ORDER BY r.oid, a.attnum)), 16)
	FROM pg_class r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped WHERE {in})
	ELSE 'transaction ' || pg_current_xact_id() END`, "in", in)
}

// fingerprintSQL is the statement of a target fingerprint: the count
// (rows) and hash sum (hash_sum) of the target rows of alias t in from (a
// FROM clause, its WHERE included) of info's target named target, over
// cols' values (rowHashSQL) or, with info.tupleIdentity, over their row
// versions (tupleHashSQL) with the target's shape (shape: tupleShapeSQL,
// over the partitions holding those rows when it is partitioned). stray,
// when not "", is a condition on a row whose count is column stray.
func fingerprintSQL(info TableInfo, cols []string, target, from, stray string, a *sqlArgs) string {
	if stray != "" {
		stray = ", count(*) FILTER (WHERE " + stray + ") AS stray"
	}
	if !info.tupleIdentity {
		return sqlf(`SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum{stray} FROM {from}`,
			"hash", rowHashSQL(info, cols, "t"), "stray", stray, "from", from)
	}
	outer, oids, partitions := "", "", ""
	if stray != "" {
		outer = ", x.stray"
	}
	if info.partitioned {
		oids, partitions = ", array_agg(DISTINCT t.tableoid) AS oids", "x.oids"
	}
	return sqlf(`SELECT x.rows, x.hash_sum{outer}, {shape} AS shape
FROM (SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum{stray}{oids} FROM {from}) x`,
		"outer", outer, "shape", tupleShapeSQL(target, partitions, a), "hash", tupleHashSQL("t"), "stray", stray, "oids", oids, "from", from)
}

// mergedFingerprint is the target fingerprint a merged chunk records,
// with what the same statement (so the same snapshot) saw of the target
// rows against the chunk's staged rows.
type mergedFingerprint struct {
	fingerprint
	// Stray counts the target rows hashed that a merge of the staged rows
	// would not leave as they are: without a staged row of their identity
	// (ChunkColumn bounds only), or differing from it in a column the
	// merge compares or the proven validators check
	// ([ComparedColumns].Checked, a superset of Compared).
	Stray int64 `db:"stray"`
}

// targetFingerprintMerged returns the fingerprint a merged chunk c
// records (recordAfterMerge), of the target rows a replay compares:
// with chunkColumn those within c's bounds (targetFingerprint's), for
// chunkColumn "" those of the identities in staging, the chunk's
// staging table (targetFingerprintKeys' at the replay), and, from the
// same statement, the count of
// those rows that differ from the staged row of their identity or have
// none. Taking both in one statement matters: under READ COMMITTED
// every statement has its own snapshot, and the merge does not lock the
// target rows it leaves unchanged, so another session may change one
// and commit between the merge and this statement. A zero Stray proves
// that the state hashed is one a merge of the staged rows leaves as it
// is, whatever happened since the merge. Errors are targetFingerprint's.
func targetFingerprintMerged(ctx context.Context, tx sqlx.ExtContext, info TableInfo, chunkColumn string, zone *time.Location, staging string, c Chunk) (mergedFingerprint, error) {
	pc, cols, err := targetFingerprintCheck(info, ValidationScope{Chunk: c, Info: info, ChunkColumn: chunkColumn, Zone: zone, Staging: staging})
	if err != nil {
		return mergedFingerprint{}, err
	}
	cc := info.Compared()
	differs := "false"
	if len(cc.Checked) > 0 {
		differs = rowExpr("t", cc.Checked, cc.expr) + " IS DISTINCT FROM " + rowExpr("s", cc.Checked, cc.expr)
	}
	var a sqlArgs
	var q, settings string
	if chunkColumn == "" {
		// Every row hashed has its staged row: the join finds them, one
		// index lookup into the target per staged row.
		q = fingerprintSQL(info, cols, pc.target, sqlf(`{staging} s JOIN {target} t ON {ts}`,
			"staging", pc.staging, "target", pc.target, "ts", pc.idMatch("t", "s")), differs, &a)
	} else {
		if _, ok := pc.cols[chunkColumn]; !ok {
			return mergedFingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: ChunkColumn %q is not a column of the target", c.ID, ErrInvalidConfig, chunkColumn)
		}
		bounds, err := pc.inChunk("t", &a)
		if err != nil {
			return mergedFingerprint{}, err
		}
		// A staged identity is never NULL (the row writer rejects a NULL
		// key), so a NULL one is a target row without a staged row. The
		// staged identities are distinct (the merge took every row, none
		// deduplicated), so each target row joins at most one.
		q = fingerprintSQL(info, cols, pc.target, sqlf(`{target} t LEFT JOIN {staging} s ON {ts} WHERE {bounds}`,
			"target", pc.target, "staging", pc.staging, "ts", pc.idMatch("t", "s"), "bounds", bounds),
			"s."+sqlgen.Ident(cc.Identity[0])+" IS NULL OR "+differs, &a)
		settings = joinsSettings
	}
	var fp mergedFingerprint
	err = pinnedQuery(ctx, tx, c, &fp, q, a, settings)
	return fp, err
}

// joinsSettings turns hash and merge joins back on for a fingerprint's
// statement (its savepoint undoes it): the merge turns them off for the
// rest of the chunk's transaction, which would leave the join of the
// target rows within a chunk's bounds to its staging table, which has
// no index, a nested loop scanning staging once per target row.
const joinsSettings = `set_config('enable_hashjoin', 'on', true), set_config('enable_mergejoin', 'on', true)`

// targetFingerprintKeys is targetFingerprint for a job without
// ChunkColumn: the target rows whose identity is among keys (keys[i]
// the text forms of identity column i, row by row), sent as arrays. A
// key in another text form than the target's (a value the spool holds
// otherwise) matches no row: the count then differs, never a wrong
// match by equality of another row.
func targetFingerprintKeys(ctx context.Context, tx sqlx.ExtContext, info TableInfo, keys [][]string, c Chunk) (fingerprint, error) {
	pc, cols, err := targetFingerprintCheck(info, ValidationScope{Chunk: c, Info: info, Staging: "-"})
	if err != nil {
		return fingerprint{}, err
	}
	var a sqlArgs
	from := keysJoin(pc, keys, &a)
	q := fingerprintSQL(info, cols, pc.target, from, "", &a)
	// The keys are text the server reads as their columns' types: pinned
	// always.
	return pinnedFingerprint(ctx, tx, c, q, a, true)
}

// keysJoin returns the FROM clause of the target rows (alias t) whose
// identity is among keys, sent as text arrays (bind parameters added to
// a), each cast to its column's type.
func keysJoin(pc *pgCheck, keys [][]string, a *sqlArgs) string {
	identity := pc.scope.Info.identity()
	arrays, names, on := make([]string, len(identity)), make([]string, len(identity)), make([]string, len(identity))
	for i, n := range identity {
		arrays[i] = a.bind(pq.Array(keys[i])) + "::text[]"
		names[i] = fmt.Sprintf("k%d", i)
		col := pc.cols[n]
		on[i] = fmt.Sprintf("t.%s = k.k%d::%s", sqlgen.Ident(n), i, cmpOr(col.Type, col.BaseType))
	}
	return sqlf(`unnest({arrays}) AS k({names}) JOIN {target} t ON {on}`,
		"arrays", strings.Join(arrays, ", "), "names", strings.Join(names, ", "), "target", pc.target, "on", strings.Join(on, " AND "))
}

// targetFingerprintCheck is the check that builds a target fingerprint's
// query for scope, and the columns hashed: every column of the target,
// identity first. It returns an error wrapping [ErrUnsupported] when a
// column has no fingerprint.
func targetFingerprintCheck(info TableInfo, scope ValidationScope) (*pgCheck, []string, error) {
	c := scope.Chunk
	pc, err := newPGCheck("target fingerprint", SeverityError, scope)
	if err != nil {
		return nil, nil, err
	}
	cols := info.identity()
	for _, col := range info.Columns {
		if !slices.Contains(cols, col.Name) {
			cols = append(cols, col.Name)
		}
	}
	for _, n := range cols {
		if col := pc.cols[n]; hashKind(col) == "" {
			return nil, nil, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: column %q of type %s has none", c.ID, ErrUnsupported, n, cmpOr(col.Type, col.BaseType))
		}
	}
	return pc, cols, nil
}

// pinnedFingerprint runs q (args a) in tx with the text forms the hash
// reads pinned: set for the statement, restored at its end
// (set_config(..., true) lasts to the end of the transaction, so a
// savepoint scopes it). When pin is false (hashReadsSettings: no value's
// hash depends on a setting) it runs q alone: one statement instead of
// four (a replay's skipped chunk waits for each).
func pinnedFingerprint(ctx context.Context, tx sqlx.ExtContext, c Chunk, q string, a sqlArgs, pin bool) (fingerprint, error) {
	var fp fingerprint
	if !pin {
		if err := sqlx.GetContext(ctx, tx, &fp, q, a...); err != nil {
			return fp, fmt.Errorf("backfill: chunk %s: target fingerprint: %w", c.ID, err)
		}
		return fp, nil
	}
	err := pinnedQuery(ctx, tx, c, &fp, q, a, "")
	return fp, err
}

// settingsFreeText are the base types whose text (textForm) is the same
// under any setting of pinnedSettings: a column of one hashed by its
// text does not need them pinned.
var settingsFreeText = map[string]bool{"text": true, "varchar": true, "bpchar": true, "numeric": true}

// hashReadsSettings reports whether the row hash of cols (pc's target
// columns, rowHashSQL) reads a setting of pinnedSettings: a column hashed
// by its text, unless of a type whose text no setting changes
// (settingsFreeText). Those hashed by their type's function (hashKind
// "func") read none: by the binary value, timestamptz AT TIME ZONE 'UTC'
// named in the expression, the reg* types by OID.
func hashReadsSettings(pc *pgCheck, cols []string) bool {
	for _, n := range cols {
		col := pc.cols[n]
		switch hashKind(col) {
		case "func":
		case "text":
			if col.userType || !settingsFreeText[col.BaseType] {
				return true
			}
		default:
			return true
		}
	}
	return false
}

// pinnedQuery is pinnedFingerprint's work: it runs q (args a), a query
// of one row, into dest, with settings too (set_config calls, local to
// the transaction, undone with the savepoint, sent with pinnedSettings;
// "" for none).
func pinnedQuery(ctx context.Context, tx sqlx.ExtContext, c Chunk, dest any, q string, a sqlArgs, settings string) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_target_fingerprint`); err != nil {
		return fmt.Errorf("backfill: chunk %s: target fingerprint: savepoint: %w", c.ID, err)
	}
	qerr := func() error {
		pin := pinnedSettings
		if settings != "" {
			pin += ", " + settings
		}
		if _, err := tx.ExecContext(ctx, pin); err != nil {
			return err
		}
		return sqlx.GetContext(ctx, tx, dest, q, a...)
	}()
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_target_fingerprint; RELEASE SAVEPOINT backfill_target_fingerprint`); err != nil {
		return fmt.Errorf("backfill: chunk %s: target fingerprint: rollback to savepoint: %w", c.ID, err)
	}
	if qerr != nil {
		return fmt.Errorf("backfill: chunk %s: target fingerprint: %w", c.ID, qerr)
	}
	return nil
}

// spoolKeyText renders v, a converted value of an identity column, as the
// text PostgreSQL reads back as the same value (the form COPY sends).
func spoolKeyText(col Column, v any) string {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case int:
		return strconv.Itoa(x)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	case string:
		return x
	case []byte:
		return `\x` + hex.EncodeToString(x)
	case time.Time:
		return string(pq.FormatTimestamp(x))
	}
	_, text := canonical(col, v)
	return text
}

// spoolKeys returns the identity of every row of sp (converted rows of
// info), as spoolKeyText forms, one slice per identity column.
func spoolKeys(ctx context.Context, sp *spool, info TableInfo) ([][]string, error) {
	identity := info.identity()
	idx := make([]int, len(identity))
	for i, n := range identity {
		idx[i] = slices.IndexFunc(info.Columns, func(c Column) bool { return c.Name == n })
		if idx[i] < 0 {
			return nil, fmt.Errorf("backfill: identity column %q is not a column of %s", n, info.Target.Table)
		}
	}
	keys := make([][]string, len(identity))
	for i := range keys {
		keys[i] = make([]string, 0, sp.Len())
	}
	err := sp.replay(ctx, func(_ int64, values []any) error {
		for i, j := range idx {
			keys[i] = append(keys[i], spoolKeyText(info.Columns[j], values[j]))
		}
		return nil
	})
	return keys, err
}

// fingerprintAdder sums the source fingerprint of the rows a row writer
// stages, then passes them on to next (the chunk's stager or spool).
// cols are the written columns (a TableInfo is not copied per row).
type fingerprintAdder struct {
	cols []Column
	fp   chunkFingerprint
	next rowAdder
}

// Add implements rowAdder.
func (a *fingerprintAdder) Add(ctx context.Context, row int64, values []any) error {
	a.fp.add(a.cols, values[:len(a.cols)])
	return a.next.Add(ctx, row, values)
}
