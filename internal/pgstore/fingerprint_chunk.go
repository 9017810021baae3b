package pgstore

import (
	"cmp"
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
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// ChunkFingerprint is an order-independent (multiset) hash of rows: their
// count and two 64-bit lanes, each the sum modulo 2^64 of a lane of each
// row's SHA-256 (of EncodeSourceRow's encoding). A sum, unlike XOR, does
// not cancel equal rows. buf is the reused encoding of a row: adding a
// row allocates nothing.
type ChunkFingerprint struct {
	Rows int64
	Sum  [2]uint64
	buf  []byte
}

// SourceEncodingVersion names EncodeSourceRow's encoding in a recorded
// source fingerprint (String), so that a fingerprint recorded under
// another encoding never compares equal to one of this encoding: the
// chunk is merged once, and records this encoding's. Version 1 (no tag,
// fixed-width lengths and integers) was recorded before it.
const SourceEncodingVersion = "v2"

// Add adds one converted row: the values of cols (the written columns),
// as ConvertValue returns them.
func (f *ChunkFingerprint) Add(cols []backfilltype.Column, values []any) {
	f.buf = EncodeSourceRow(f.buf[:0], cols, values)
	sum := sha256.Sum256(f.buf)
	f.Rows++
	f.Sum[0] += binary.BigEndian.Uint64(sum[0:8])
	f.Sum[1] += binary.BigEndian.Uint64(sum[8:16])
}

// String renders the fingerprint for the manifest: the encoding version,
// then rows:lane0:lane1 in hexadecimal, e.g. "v2:3:1f…:a2…".
func (f ChunkFingerprint) String() string {
	return fmt.Sprintf("%s:%d:%016x:%016x", SourceEncodingVersion, f.Rows, f.Sum[0], f.Sum[1])
}

// Tags of EncodeSourceRow: one byte before each value, its type (and a
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

// EncodeSourceRow appends to buf an unambiguous encoding of the values of
// cols (the written columns) of a converted row, key columns included,
// in column order (the
// encoding of SourceEncodingVersion): per column a tag (NULL, or the
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
func EncodeSourceRow(buf []byte, cols []backfilltype.Column, values []any) []byte {
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

// TargetFingerprint returns the multiset hash of chunk c's target rows:
// the rows of info's target whose chunkColumn lies within c's bounds (zone
// for a timestamp or date column, nil for UTC), over every column of info
// (identity first), computed by the server in tx without writing. It
// returns an error wrapping [backfilltype.ErrUnsupported] when a column has no
// fingerprint ([HashKind]) or chunkColumn is "", and the query's error.
func TargetFingerprint(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, chunkColumn string, zone *time.Location, c backfilltype.Chunk) (Fingerprint, error) {
	return targetFingerprint(ctx, tx, info, chunkColumn, zone, c, "")
}

// targetFingerprint is TargetFingerprint or, when insertedBy is not "",
// TargetInsertedCount.
func targetFingerprint(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, chunkColumn string, zone *time.Location, c backfilltype.Chunk, insertedBy string) (Fingerprint, error) {
	if chunkColumn == "" {
		return Fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: no ChunkColumn bounds the chunk's target rows", c.ID, backfilltype.ErrUnsupported)
	}
	// Staging is never read: the check only builds the target's query.
	pc, cols, err := TargetFingerprintCheck(info, backfilldriver.ValidationScope{Chunk: c, Info: info, ChunkColumn: chunkColumn, Zone: zone, Staging: "-"})
	if err != nil {
		return Fingerprint{}, err
	}
	if _, ok := pc.Cols[chunkColumn]; !ok {
		return Fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: ChunkColumn %q is not a column of the target", c.ID, backfilltype.ErrInvalidConfig, chunkColumn)
	}
	var a SQLArgs
	bounds, err := pc.InChunk("t", &a)
	if err != nil {
		return Fingerprint{}, err
	}
	// A list chunk's bound is its item's text, which the server reads as
	// the ChunkColumn's type (under DateStyle and TimeZone for a time);
	// an int chunk's are numbers and a time chunk's instants with their
	// offsets (inChunk), read alike under any setting.
	if info.TupleIdentity {
		xid := ""
		if insertedBy != "" {
			xid = a.Bind(insertedBy)
		}
		q := fingerprintSQLOf(info, cols, pc.target, pc.target+" t WHERE "+bounds, "", xid, &a)
		return pinnedFingerprint(ctx, tx, c, q, a, c.Kind == backfilltype.KindList)
	}
	if insertedBy != "" {
		return Fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: rows inserted by a transaction are counted on a heap target only", c.ID, backfilltype.ErrUnsupported)
	}
	return pinnedFingerprint(ctx, tx, c, pc.FingerprintTargetSQL(cols, bounds), a, c.Kind == backfilltype.KindList || HashReadsSettings(pc, cols))
}

// TargetInsertedCount is TargetFingerprint of a chunk whose base recorded
// the rows its merge inserted ([InsertedProof]): on a target with
// TupleIdentity, Sum is the count, as text, of the rows within c's
// bounds whose xmin is xid (the decimal transaction ID the base
// recorded), Rows the count of all of them, Shape the target's shape.
// When both counts are the base's row count and the shape is its shape,
// the chunk's target rows are the row versions the base's merge
// inserted, unchanged since. Errors are TargetFingerprint's, and one
// wrapping [backfilltype.ErrUnsupported] for a target without
// TupleIdentity.
func TargetInsertedCount(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, chunkColumn string, zone *time.Location, c backfilltype.Chunk, xid string) (Fingerprint, error) {
	if xid == "" {
		return Fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: no transaction ID", c.ID, backfilltype.ErrInvalidConfig)
	}
	return targetFingerprint(ctx, tx, info, chunkColumn, zone, c, xid)
}

// tupleHashSQL is the hash of the tuple identity of the target row of
// alias: its table (a partition's own), its place (ctid) and the
// transaction that wrote it (xmin). The heap never changes a row version
// in place: an UPDATE writes a new version at another ctid with its own
// xmin, a DELETE removes one (the count drops), an INSERT adds one. So
// the rows of a chunk whose identities are the same multiset as at the
// last load are the same row versions, byte for byte, whatever their
// width: the target side of a skip is checked without reading a value.
// Freezing keeps the raw xmin (PostgreSQL 9.4 and later); a
// rewrite (VACUUM FULL, CLUSTER, a column type change) moves every row,
// and the chunk then merges once (writing nothing) and records the new
// identities. What it does not see: a row version left behind at a
// ctid and reused by one whose writer's 32-bit xid equals the first's,
// which takes about 2^32 transactions between the two loads; and target
// tables other than heap ones, whose fingerprints hash values
// (TableInfo.TupleIdentity is false for them).
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
func tupleShapeSQL(target, oids string, a *SQLArgs) string {
	rel := a.Bind(target) + "::regclass"
	in := "r.oid = " + rel
	if oids != "" {
		in += " OR r.oid = ANY (" + oids + ")"
	}
	return SQLf(`CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN
	(SELECT left(md5(string_agg(format('%s.%s.%s.%s.%s.%s.%s', r.oid, r.relkind, r.relam, a.attnum, a.attname, a.atttypid, a.atttypmod), ',' ORDER BY r.oid, a.attnum)), 16)
	FROM pg_class r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped WHERE {in})
	ELSE 'transaction ' || pg_current_xact_id() END`, "in", in)
}

// fingerprintSQL is the statement of a target fingerprint: the count
// (rows) and hash sum (hash_sum) of the target rows of alias t in from (a
// FROM clause, its WHERE included) of info's target named target, over
// cols' values (RowHashSQL) or, with info.TupleIdentity, over their row
// versions (tupleHashSQL) with the target's shape (shape: tupleShapeSQL,
// over the partitions holding those rows when it is partitioned). stray,
// when not "", is a condition on a row whose count is column stray.
func fingerprintSQL(info backfilltype.TableInfo, cols []string, target, from, stray string, a *SQLArgs) string {
	return fingerprintSQLOf(info, cols, target, from, stray, "", a)
}

// fingerprintSQLOf is fingerprintSQL with, when insertedBy is not "" (a
// tuple fingerprint only), hash_sum the count of the rows whose xmin is
// insertedBy (a bind parameter: insertedRowsSQL) instead of the sum of
// their tuple hashes.
func fingerprintSQLOf(info backfilltype.TableInfo, cols []string, target, from, stray, insertedBy string, a *SQLArgs) string {
	if stray != "" {
		stray = ", count(*) FILTER (WHERE " + stray + ") AS stray"
	}
	if !info.TupleIdentity {
		return SQLf(`SELECT count(*) AS rows, coalesce(sum({hash}), 0)::text AS hash_sum{stray} FROM {from}`,
			"hash", RowHashSQL(info, cols, "t"), "stray", stray, "from", from)
	}
	outer, oids, partitions := "", "", ""
	if stray != "" {
		outer = ", x.stray"
	}
	if info.Partitioned {
		oids, partitions = ", array_agg(DISTINCT t.tableoid) AS oids", "x.oids"
	}
	hash := "coalesce(sum(" + tupleHashSQL("t") + "), 0)::text"
	if insertedBy != "" {
		hash = "count(*) FILTER (WHERE t.xmin = " + insertedBy + "::xid)::text"
	}
	return SQLf(`SELECT x.rows, x.hash_sum{outer}, {shape} AS shape
FROM (SELECT count(*) AS rows, {hash} AS hash_sum{stray}{oids} FROM {from}) x`,
		"outer", outer, "shape", tupleShapeSQL(target, partitions, a), "hash", hash, "stray", stray, "oids", oids, "from", from)
}

// MergedFingerprint is the target fingerprint a merged chunk records,
// with what the same statement (so the same snapshot) saw of the target
// rows against the chunk's staged rows.
type MergedFingerprint struct {
	Fingerprint
	// Stray counts the target rows hashed that a merge of the staged rows
	// would not leave as they are: without a staged row of their identity
	// (ChunkColumn bounds only), or differing from it in a column the
	// merge compares or the proven validators check
	// ([ComparedColumns].Checked, a superset of Compared).
	Stray int64 `db:"stray"`
}

// TargetFingerprintMerged returns the fingerprint a merged chunk c
// records (recordAfterMerge), of the target rows a replay compares:
// with chunkColumn those within c's bounds (TargetFingerprint's), for
// chunkColumn "" those of the identities in staging, the chunk's
// staging table (TargetFingerprintKeys' at the replay), and, from the
// same statement, the count of
// those rows that differ from the staged row of their identity or have
// none. Taking both in one statement matters: under READ COMMITTED
// every statement has its own snapshot, and the merge does not lock the
// target rows it leaves unchanged, so another session may change one
// and commit between the merge and this statement. A zero Stray proves
// that the state hashed is one a merge of the staged rows leaves as it
// is, whatever happened since the merge. Errors are TargetFingerprint's.
func TargetFingerprintMerged(ctx context.Context, tx sqlx.ExtContext, p TargetFingerprintMergedParams) (MergedFingerprint, error) {
	info, chunkColumn, c := p.Info, p.ChunkColumn, p.Chunk
	pc, cols, err := TargetFingerprintCheck(info, backfilldriver.ValidationScope{Chunk: c, Info: info, ChunkColumn: chunkColumn, Zone: p.Zone, Staging: p.Staging})
	if err != nil {
		return MergedFingerprint{}, err
	}
	cc := CompareColumns(info)
	differs := "false"
	if len(cc.Checked) > 0 {
		differs = rowExpr("t", cc.Checked, cc.expr) + " IS DISTINCT FROM " + rowExpr("s", cc.Checked, cc.expr)
	}
	var a SQLArgs
	var q, settings string
	if chunkColumn == "" {
		// Every row hashed has its staged row: the join finds them, one
		// index lookup into the target per staged row.
		q = fingerprintSQL(info, cols, pc.target, SQLf(`{staging} s JOIN {target} t ON {ts}`,
			"staging", pc.Staging, "target", pc.target, "ts", pc.idMatch("t", "s")), differs, &a)
	} else {
		if _, ok := pc.Cols[chunkColumn]; !ok {
			return MergedFingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: ChunkColumn %q is not a column of the target", c.ID, backfilltype.ErrInvalidConfig, chunkColumn)
		}
		bounds, err := pc.InChunk("t", &a)
		if err != nil {
			return MergedFingerprint{}, err
		}
		// A staged identity is never NULL (the row writer rejects a NULL
		// key), so a NULL one is a target row without a staged row. The
		// staged identities are distinct (the merge took every row, none
		// deduplicated), so each target row joins at most one.
		q = fingerprintSQL(info, cols, pc.target, SQLf(`{target} t LEFT JOIN {staging} s ON {ts} WHERE {bounds}`,
			"target", pc.target, "staging", pc.Staging, "ts", pc.idMatch("t", "s"), "bounds", bounds),
			"s."+sqlgen.Ident(cc.Identity[0])+" IS NULL OR "+differs, &a)
		settings = joinsSettings
	}
	var fp MergedFingerprint
	err = pinnedQuery(ctx, tx, pinnedQueryParams{Chunk: c, Dest: &fp, Query: q, Args: a, Settings: settings})
	return fp, err
}

// TargetFingerprintMergedParams are the arguments of
// [TargetFingerprintMerged]: the merged chunk Chunk of the target Info,
// the job's ChunkColumn ("" for none) and Zone (nil for UTC), and the
// chunk's Staging table (quoted).
type TargetFingerprintMergedParams struct {
	Info        backfilltype.TableInfo
	ChunkColumn string
	Zone        *time.Location
	Staging     string
	Chunk       backfilltype.Chunk
}

// joinsSettings turns hash and merge joins back on for a fingerprint's
// statement (its savepoint undoes it): the merge turns them off for the
// rest of the chunk's transaction, which would leave the join of the
// target rows within a chunk's bounds to its staging table, which has
// no index, a nested loop scanning staging once per target row.
const joinsSettings = `set_config('enable_hashjoin', 'on', true), set_config('enable_mergejoin', 'on', true)`

// TargetFingerprintKeys is TargetFingerprint for a job without
// ChunkColumn: the target rows whose identity is among keys (keys[i]
// the text forms of identity column i, row by row), sent as arrays. A
// key in another text form than the target's (a value the spool holds
// otherwise) matches no row: the count then differs, never a wrong
// match by equality of another row.
func TargetFingerprintKeys(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, keys [][]string, c backfilltype.Chunk) (Fingerprint, error) {
	return TargetInsertedCountKeys(ctx, tx, info, keys, c, "")
}

// TargetInsertedCountKeys is TargetInsertedCount for a job without
// ChunkColumn: the target rows whose identity is among keys (as
// TargetFingerprintKeys reads them), Sum the count of those whose xmin
// is xid. With xid "" it is TargetFingerprintKeys.
func TargetInsertedCountKeys(ctx context.Context, tx sqlx.ExtContext, info backfilltype.TableInfo, keys [][]string, c backfilltype.Chunk, xid string) (Fingerprint, error) {
	if xid != "" && !info.TupleIdentity {
		return Fingerprint{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: rows inserted by a transaction are counted on a heap target only", c.ID, backfilltype.ErrUnsupported)
	}
	pc, cols, err := TargetFingerprintCheck(info, backfilldriver.ValidationScope{Chunk: c, Info: info, Staging: "-"})
	if err != nil {
		return Fingerprint{}, err
	}
	var a SQLArgs
	from := KeysJoin(pc, keys, &a)
	if xid != "" {
		xid = a.Bind(xid)
	}
	q := fingerprintSQLOf(info, cols, pc.target, from, "", xid, &a)
	// The keys are text the server reads as their columns' types: pinned
	// always.
	return pinnedFingerprint(ctx, tx, c, q, a, true)
}

// KeysJoin returns the FROM clause of the target rows (alias t) whose
// identity is among keys, sent as text arrays (bind parameters added to
// a), each cast to its column's type.
func KeysJoin(pc *PGCheck, keys [][]string, a *SQLArgs) string {
	identity := pc.scope.Info.Identity()
	arrays, names, on := make([]string, len(identity)), make([]string, len(identity)), make([]string, len(identity))
	for i, n := range identity {
		arrays[i] = a.Bind(pq.Array(keys[i])) + "::text[]"
		names[i] = fmt.Sprintf("k%d", i)
		col := pc.Cols[n]
		on[i] = fmt.Sprintf("t.%s = k.k%d::%s", sqlgen.Ident(n), i, cmp.Or(col.Type, col.BaseType))
	}
	return SQLf(`unnest({arrays}) AS k({names}) JOIN {target} t ON {on}`,
		"arrays", strings.Join(arrays, ", "), "names", strings.Join(names, ", "), "target", pc.target, "on", strings.Join(on, " AND "))
}

// TargetFingerprintCheck is the check that builds a target fingerprint's
// query for scope, and the columns hashed: every column of the target,
// identity first. It returns an error wrapping
// [backfilltype.ErrUnsupported] when a column has no fingerprint.
func TargetFingerprintCheck(info backfilltype.TableInfo, scope backfilldriver.ValidationScope) (*PGCheck, []string, error) {
	c := scope.Chunk
	pc, err := NewPGCheck("target fingerprint", backfilltype.SeverityError, scope)
	if err != nil {
		return nil, nil, err
	}
	cols := info.Identity()
	for _, col := range info.Columns {
		if !slices.Contains(cols, col.Name) {
			cols = append(cols, col.Name)
		}
	}
	for _, n := range cols {
		if col := pc.Cols[n]; HashKind(col) == "" {
			return nil, nil, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: column %q of type %s has none", c.ID, backfilltype.ErrUnsupported, n, cmp.Or(col.Type, col.BaseType))
		}
	}
	return pc, cols, nil
}

// pinnedFingerprint runs q (args a) in tx with the text forms the hash
// reads pinned: set for the statement, restored at its end
// (set_config(..., true) lasts to the end of the transaction, so a
// savepoint scopes it). When pin is false (HashReadsSettings: no value's
// hash depends on a setting) it runs q alone: one statement instead of
// four (a replay's skipped chunk waits for each).
func pinnedFingerprint(ctx context.Context, tx sqlx.ExtContext, c backfilltype.Chunk, q string, a SQLArgs, pin bool) (Fingerprint, error) {
	var fp Fingerprint
	if !pin {
		if err := sqlx.GetContext(ctx, tx, &fp, q, a...); err != nil {
			return fp, fmt.Errorf("backfill: chunk %s: target fingerprint: %w", c.ID, err)
		}
		return fp, nil
	}
	err := pinnedQuery(ctx, tx, pinnedQueryParams{Chunk: c, Dest: &fp, Query: q, Args: a})
	return fp, err
}

// settingsFreeText are the base types whose text (textForm) is the same
// under any setting of pinnedSettings: a column of one hashed by its
// text does not need them pinned.
var settingsFreeText = map[string]bool{"text": true, "varchar": true, "bpchar": true, "numeric": true}

// HashReadsSettings reports whether the row hash of cols (pc's target
// columns, RowHashSQL) reads a setting of pinnedSettings: a column hashed
// by its text, unless of a type whose text no setting changes
// (settingsFreeText). Those hashed by their type's function (HashKind
// "func") read none: by the binary value, timestamptz AT TIME ZONE 'UTC'
// named in the expression, the reg* types by OID.
func HashReadsSettings(pc *PGCheck, cols []string) bool {
	for _, n := range cols {
		col := pc.Cols[n]
		switch HashKind(col) {
		case "func":
		case "text":
			if col.UserType || !settingsFreeText[col.BaseType] {
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
func pinnedQuery(ctx context.Context, tx sqlx.ExtContext, p pinnedQueryParams) error {
	c, dest, q, a, settings := p.Chunk, p.Dest, p.Query, p.Args, p.Settings
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

// pinnedQueryParams are the arguments of pinnedQuery: the query Query
// with its arguments Args, scanned into Dest, the extra Settings ("" for
// none), and the Chunk whose ID the errors name.
type pinnedQueryParams struct {
	Chunk    backfilltype.Chunk
	Dest     any
	Query    string
	Args     SQLArgs
	Settings string
}

// SpoolKeyText renders v, a converted value of an identity column, as the
// text PostgreSQL reads back as the same value (the form COPY sends).
func SpoolKeyText(col backfilltype.Column, v any) string {
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

// FingerprintAdder sums the source fingerprint of the rows a row writer
// stages, then passes them on to next (the chunk's stager or spool).
// Cols are the written columns (a TableInfo is not copied per row).
type FingerprintAdder struct {
	Cols []backfilltype.Column `json:"-" db:"-"`
	Fp   ChunkFingerprint      `json:"-" db:"-"`
	Next RowAdder              `json:"-" db:"-"`
}

// Add implements RowAdder.
func (a *FingerprintAdder) Add(ctx context.Context, row int64, values []any) error {
	a.Fp.Add(a.Cols, values[:len(a.Cols)])
	return a.Next.Add(ctx, row, values)
}

// InsertedProof is what [TargetInserted] read, in the chunk's
// transaction after a merge that inserted every staged row.
type InsertedProof struct {
	// Xid is the xmin, in decimal, of the target row of the first staged
	// row's identity: the (sub)transaction that inserted it. "" when
	// none was found.
	Xid string `db:"xid"`
	// Shape is the target's shape (tupleShapeSQL) over the target and
	// the partition holding that row.
	Shape string `db:"shape"`
	// Rewrites: the target or that partition has an enabled BEFORE ROW
	// INSERT trigger (which may store other values than the staged ones)
	// or an INSERT rule.
	Rewrites bool `db:"rewrites"`
}

// TargetInserted returns, for a chunk whose merge inserted every one of
// its staged rows (p.Staging) into p.Info's target (TupleIdentity only),
// the transaction that inserted them and the target's shape: one index
// probe and the catalog, where TargetFingerprintMerged scans the chunk's
// target rows and joins them to staging.
//
// Why that is a proof of what TargetFingerprintMerged proves: each staged
// row is a row version this transaction inserted, which no other
// session can see, change or delete before it commits, and which holds
// the staged values unless a BEFORE ROW INSERT trigger or a rule
// changed it (Rewrites; a trigger created since the merge would wait
// for the merge's lock on the target). The chunk records the count of
// staged rows, Xid and Shape: a replay finds, within the chunk's bounds
// (TargetInsertedCount; of the chunk's identities without ChunkColumn,
// TargetInsertedCountKeys), exactly that many rows, all of xmin Xid,
// under the same shape, only when they are those row versions, unchanged
// (an UPDATE writes a new version with another xmin, a DELETE removes
// one), and no other row is in the bounds (a row another session wrote,
// before or after the merge, is one more). Rows inserted in several
// subtransactions (staging restarted, a merge split to isolate a refused
// row) have several xmins: the count of Xid's falls short and the chunk
// merges once. Errors are the query's.
func TargetInserted(ctx context.Context, tx sqlx.ExtContext, p TargetFingerprintMergedParams) (InsertedProof, error) {
	info, c := p.Info, p.Chunk
	if !info.TupleIdentity {
		return InsertedProof{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w: rows inserted by a transaction are counted on a heap target only", c.ID, backfilltype.ErrUnsupported)
	}
	pc, err := NewPGCheck("target fingerprint", backfilltype.SeverityError, backfilldriver.ValidationScope{Chunk: c, Info: info, ChunkColumn: p.ChunkColumn, Zone: p.Zone, Staging: p.Staging})
	if err != nil {
		return InsertedProof{}, err
	}
	var a SQLArgs
	partitions := ""
	if info.Partitioned {
		partitions = "ARRAY[x.tableoid]"
	}
	shape := tupleShapeSQL(pc.target, partitions, &a)
	rel := a.Bind(pc.target) + "::regclass"
	// tgtype: TRIGGER_TYPE_ROW 1, BEFORE 2, INSERT 4; rules: ev_type '3'
	// (INSERT).
	q := SQLf(`SELECT x.xid, {shape} AS shape,
	EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid IN ({rel}, x.tableoid) AND g.tgenabled <> 'D' AND (g.tgtype & 7) = 7)
	OR EXISTS (SELECT FROM pg_rewrite w WHERE w.ev_class IN ({rel}, x.tableoid) AND w.ev_type = '3') AS rewrites
FROM (SELECT t.xmin::text AS xid, t.tableoid FROM {staging} s JOIN {target} t ON {ts} LIMIT 1) x`,
		"shape", shape, "rel", rel, "staging", pc.Staging, "target", pc.target, "ts", pc.idMatch("t", "s"))
	var rows []InsertedProof
	if err := sqlx.SelectContext(ctx, tx, &rows, q, a...); err != nil {
		return InsertedProof{}, fmt.Errorf("backfill: chunk %s: target fingerprint: %w", c.ID, err)
	}
	if len(rows) == 0 {
		return InsertedProof{}, nil
	}
	return rows[0], nil
}
