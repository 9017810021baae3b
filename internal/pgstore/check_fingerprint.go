package pgstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Fingerprint is the multiset hash of one side of a chunk (its staged
// rows, or its target rows): its row count and the sum, as a numeric in
// text, of a 64-bit hash of each row ([RowHashSQL]). The sum is additive
// (equal rows do not cancel), and each column's hash is seeded with the
// hash of the columns before it and its position ([PositionKey]), so a
// value moved to another column or row changes it. Equal fingerprints
// prove the two sides the same multiset of rows on the hashed columns,
// up to a collision chance of about 2^-64, and to one structured
// weakness: PostgreSQL's timestamp hash folds the 64-bit value to 32 bits
// (low half XOR high half), so timestamps whose halves XOR alike hash
// alike. The checks then pass without their joins; a mismatch runs them.
// The design note docs/design/checks-and-fingerprints.md explains the
// choices.
type Fingerprint struct {
	Rows int64  `json:"rows" db:"rows"`
	Sum  string `json:"hash_sum" db:"hash_sum"`
	// Shape is the target's shape read with a tuple fingerprint
	// ([tupleShapeSQL]); "" otherwise.
	Shape string `json:"shape,omitempty" db:"shape"`
}

// FingerprintProof is the outcome of comparing the staged rows' and the
// chunk's target rows' fingerprints.
type FingerprintProof struct {
	// Equal: the two sides are the same multiset of rows.
	Equal bool `json:"equal"`
	// Staged and Target are the two fingerprints.
	Staged Fingerprint `json:"staged"`
	Target Fingerprint `json:"target"`
	// TargetRows says which target rows were hashed: the chunk's rows by
	// ChunkColumn, or the target rows of the staged identities.
	TargetRows string `json:"target_rows"`
	// Columns are the hashed columns: the identity, then the content.
	Columns []string `json:"columns"`
	// Error says why no proof could be computed (then Equal is false).
	Error string `json:"error,omitempty"`
}

// Evidence returns the proof as Detail entries.
func (p *FingerprintProof) Evidence(detail map[string]any) {
	if p == nil {
		detail["method"] = "exact"
		return
	}
	if p.Equal {
		detail["method"] = "fingerprint"
	} else {
		detail["method"] = "exact"
	}
	b, err := json.Marshal(p)
	if err == nil {
		detail["fingerprint"] = json.RawMessage(b)
	}
}

// fingerprintSeed starts every row hash: an arbitrary constant.
const fingerprintSeed = "7020098106520436578"

// HashFuncs maps a column's BaseType to an extended hash function (the
// support function 2 of the type's default hash operator class, pg_amproc)
// as a format taking the value and the seed (both SQL expressions), and a
// value of the type that stands in for NULL. Listed are only the types
// whose function mixes every bit of the value and of the seed, so that
// the chain of seeds carries every column before it. Left out, and hashed
// by their text instead: numeric (its hash ignores the sign, 1 and -1 hash
// alike, and returns the seed for NaN and both infinities), jsonb ('{}'
// and '[]' hash alike), arrays (an empty array or one of NULLs hashes to a
// constant, whatever the seed), and interval, time and date (whose hashes
// fold 64 bits to 32 or cannot be called on the type). Text is exact but
// stricter than equality: 1.0 and 1.00 differ as text, and such a column
// sends the check to its exact comparison. bigint hashes its high half as
// well, as hashint8extended folds the value to 32 bits (lo ^ hi); the
// timestamps keep the fold (see [Fingerprint]).
var HashFuncs = map[string]struct{ format, zero string }{
	"int2":        {"hashint2extended(%s, %s)", "'0'"},
	"int4":        {"hashint4extended(%s, %s)", "'0'"},
	"int8":        {"hashint8extended(%[1]s >> 32, hashint8extended(%[1]s, %[2]s))", "'0'"},
	"oid":         {"hashoidextended(%s, %s)", "'0'"},
	"bool":        {"hashint4extended(%s::int4, %s)", "false"},
	"float4":      {"hashfloat4extended(%s, %s)", "'0'"},
	"float8":      {"hashfloat8extended(%s, %s)", "'0'"},
	"text":        {"hashtextextended(%s, %s)", "''"},
	"varchar":     {"hashtextextended(%s::text, %s)", "''"},
	"bpchar":      {"hashbpcharextended(%s, %s)", "''"},
	"uuid":        {"uuid_hash_extended(%s, %s)", "'00000000-0000-0000-0000-000000000000'"},
	"inet":        {"hashinetextended(%s, %s)", "'0.0.0.0'"},
	"cidr":        {"hashinetextended(%s::inet, %s)", "'0.0.0.0/0'"},
	"timestamp":   {"timestamp_hash_extended(%s, %s)", "'epoch'"},
	"timestamptz": {"timestamp_hash_extended(%s AT TIME ZONE 'UTC', %s)", "'epoch'"},
	// The object identifier types print names that need not be unique
	// (overloaded functions, search_path): they hash their OID.
	"regproc":       {"hashoidextended(%s::oid, %s)", "'0'"},
	"regprocedure":  {"hashoidextended(%s::oid, %s)", "'0'"},
	"regoper":       {"hashoidextended(%s::oid, %s)", "'0'"},
	"regoperator":   {"hashoidextended(%s::oid, %s)", "'0'"},
	"regclass":      {"hashoidextended(%s::oid, %s)", "'0'"},
	"regtype":       {"hashoidextended(%s::oid, %s)", "'0'"},
	"regrole":       {"hashoidextended(%s::oid, %s)", "'0'"},
	"regnamespace":  {"hashoidextended(%s::oid, %s)", "'0'"},
	"regconfig":     {"hashoidextended(%s::oid, %s)", "'0'"},
	"regdictionary": {"hashoidextended(%s::oid, %s)", "'0'"},
	"regcollation":  {"hashoidextended(%s::oid, %s)", "'0'"},
}

// textHashed lists the built-in types hashed by their text: their output
// is one-to-one under the settings fingerprints pin (pinnedSettings).
// Enums (labels are unique within an enum), built-in ranges and
// multiranges, and arrays of hashable elements are hashed by text too.
// Any other type (composites; tsquery, whose different trees can print
// alike; arrays of reg* types; types of extensions or users, whose output
// may drop information) has no fingerprint: the checks run their exact
// comparisons for a table that has one. Text is hashed under the "C"
// collation, byte by byte: a column's nondeterministic collation would
// otherwise hash the array syntax {a,b} like {"a,b"}, or 'a,b' like 'ab'
// in a citext column whose = tells them apart.
var textHashed = map[string]bool{
	"numeric": true, "date": true, "time": true, "timetz": true, "interval": true,
	"json": true, "jsonb": true, "xml": true, "bytea": true, "money": true,
	"bit": true, "varbit": true, "macaddr": true, "macaddr8": true, "tsvector": true,
	"point": true, "line": true, "lseg": true, "box": true, "path": true, "polygon": true, "circle": true,
	"name": true, "char": true, "pg_lsn": true, "xid8": true,
	"citext": true, // extension type, its text is its value
}

// pinnedSettings fixes, inside the fingerprint's savepoint, the settings
// that change how values print: shortest exact floats (extra_float_digits
// 1, the default since PostgreSQL 12, a value of 0 or less rounds),
// ISO dates with numeric zone offsets in UTC (DateStyle SQL prints zone
// abbreviations that two instants can share), one interval style, hex
// bytea and the C locale's money format (PostgreSQL docs, 20.11.2
// "Locale and Formatting").
const pinnedSettings = `SELECT set_config('extra_float_digits', '1', true), set_config('DateStyle', 'ISO, MDY', true),
	set_config('TimeZone', 'UTC', true), set_config('IntervalStyle', 'postgres', true), set_config('bytea_output', 'hex', true),
	set_config('lc_monetary', 'C', true)`

// HashKind says how a column is hashed: by its type's hash function
// (HashFuncs), by its text, or not at all ("").
func HashKind(col backfilltype.Column) string {
	if strings.HasPrefix(col.BaseType, "_") && (col.ElemKind != "" || !col.UserType) {
		// An array (of a user's type, the array type is the user's too):
		// by its text, when its elements' text is one-to-one.
		return arrayHashKind(col)
	}
	switch {
	case col.UserType && col.Kind == "e":
		return "text"
	case col.UserType && col.BaseType != "citext":
		return ""
	case col.Kind == "c" || col.Kind == "p":
		return ""
	}
	// Only types whose own equality is exact ([exactEquality], the merge's
	// rule) hash by their type's function; the others
	// (float 0 and -0 hash alike; text under a collation of its own hashes
	// its sort key) hash their text, as the merge compares it.
	_, hashable := HashFuncs[col.BaseType]
	if hashable && exactEquality(col) {
		return "func"
	}
	if hashable || hashesText(col) {
		return "text"
	}
	return ""
}

// arrayHashKind is HashKind of the array column col: "text" when its
// elements hash by their text, or by their type's function and are not
// of a reg* type; otherwise "" (not hashed).
func arrayHashKind(col backfilltype.Column) string {
	elem := backfilltype.Column{BaseType: col.BaseType[1:], Kind: col.ElemKind, UserType: col.UserElem}
	if k := HashKind(elem); k == "text" || k == "func" && !strings.HasPrefix(elem.BaseType, "reg") {
		return "text"
	}
	return ""
}

// hashesText reports whether col, of a type without a hash function of
// its own, is hashed by its text: a type in textHashed, TextCompared or
// LooseEquality, a range or a multirange.
func hashesText(col backfilltype.Column) bool {
	return textHashed[col.BaseType] || TextCompared[col.BaseType] || LooseEquality[col.BaseType] || col.Kind == "r" || col.Kind == "m"
}

// hashStep returns the SQL expression hashing column col of alias with
// seed (a bigint SQL expression); pos is the column's position in the row
// hash. The seed is first XORed with a constant of the position
// (PositionKey), another one when the value is NULL, which then hashes as
// the type's stand-in value. Constants per position matter because some
// values hash to the seed itself (float zero, hashfloat8extended): with a
// bare seed, (0, 2.5) and (2.5, 0) in a float8 and a real column would
// collide, as would (NULL, 0) and (0, NULL) with one NULL marker for all
// positions. notNull drops the NULL handling for columns that cannot be
// NULL.
func hashStep(col backfilltype.Column, alias, seed string, pos int, notNull bool) string {
	raw := alias + "." + sqlgen.Ident(col.Name)
	e := raw
	f := HashFuncs[col.BaseType]
	if HashKind(col) != "func" {
		// A text column of a collation of its own is hashed here too: its
		// type's hash would hash the sort key ('a' and 'A' alike under a
		// case-insensitive collation).
		f = struct{ format, zero string }{"hashtextextended(%s, %s)", "''"}
		e = "(" + textForm(col, e) + ` COLLATE "C")`
	}
	if notNull {
		return fmt.Sprintf(f.format, e, fmt.Sprintf("(%s # %d::int8)", seed, PositionKey(pos)))
	}
	return fmt.Sprintf(f.format, "coalesce("+e+", "+f.zero+")",
		fmt.Sprintf("(%s # CASE WHEN %s IS NULL THEN %d::int8 ELSE %d::int8 END)", seed, raw, PositionKey(pos+1<<20), PositionKey(pos)))
}

// PositionKey returns a pseudo-random 64-bit constant for position i:
// SplitMix64's output function (Steele, Lea and Flood, "Fast Splittable
// Pseudorandom Number Generators", OOPSLA 2014).
func PositionKey(i int) int64 {
	z := uint64(i+1) * 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return int64(z ^ (z >> 31))
}

// RowHashSQL returns the bigint SQL expression hashing cols of alias, in
// order: each column's hash seeded with the hash of those before it.
func RowHashSQL(info backfilltype.TableInfo, cols []string, alias string) string {
	byName := map[string]backfilltype.Column{}
	for _, c := range info.Columns {
		byName[c.Name] = c
	}
	h := fingerprintSeed + "::int8"
	for pos, n := range cols {
		c := byName[n]
		// Key columns are never NULL in staging (the row writer rejects a
		// NULL key); NOT NULL columns are never NULL in the target. A NULL
		// in staging where the target is NOT NULL (a staged row that lost
		// to the target's) makes its row hash NULL, which sum skips: the
		// fingerprints then differ, which is right, as the rows do. For a
		// value that is not NULL both forms of hashStep agree.
		h = hashStep(c, alias, h, pos, c.NotNull || slices.Contains(info.Target.Key, n))
	}
	return h
}

// FingerprintColumns returns the columns a fingerprint hashes: the
// Identity, then the content the checks compare ([CompareColumns]).
func (c *PGCheck) FingerprintColumns() []string {
	cc := CompareColumns(c.scope.Info)
	return append(cc.Identity, cc.Checked...)
}

// fingerprintKeeper is implemented by stagers that keep the chunk's
// fingerprints for the checks that follow ([Merger]'s).
type fingerprintKeeper interface {
	fingerprintMemo() map[string]*FingerprintProof
}

// fingerprints returns the proof for the check's scope, computing it on
// the first call of a chunk and returning the stager's copy afterwards.
// An error of the queries themselves is not returned: the proof then has
// Equal false and Error set, and the checks run their exact comparison
// (the queries run inside a savepoint that is rolled back, so a failed
// query leaves the chunk's transaction usable). Errors returned are those
// of the savepoint commands.
func (c *PGCheck) fingerprints(ctx context.Context, tx sqlx.ExtContext) (*FingerprintProof, error) {
	var a SQLArgs
	cols := c.FingerprintColumns()
	p := &FingerprintProof{Columns: cols}
	targetQ, join, err := c.fingerprintTarget(p, cols, &a)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprint(targetQ, a)
	memo, _ := c.scope.Stager.(fingerprintKeeper)
	if memo != nil {
		if cached := memo.fingerprintMemo()[key]; cached != nil {
			return cached, nil
		}
	}
	if p.Error = c.unhashable(cols); p.Error != "" {
		rememberFingerprint(memo, key, p)
		return p, nil
	}
	q := fingerprintQueries{staging: c.FingerprintStagingSQL(cols), target: targetQ, args: a}
	if q.settings, err = c.fingerprintSettings(ctx, tx, join); err != nil {
		return nil, err
	}
	if err := runFingerprints(ctx, tx, p, q); err != nil {
		return nil, err
	}
	rememberFingerprint(memo, key, p)
	return p, nil
}

// fingerprintQueries are the statements of one fingerprint: the staged
// rows' query, the settings for the target's query (none: ""), and the
// target rows' query with its arguments.
type fingerprintQueries struct {
	staging  string
	settings string
	target   string
	args     SQLArgs
}

// fingerprintTarget returns the query fingerprinting the chunk's target
// rows, of cols, binding its arguments to a, and sets p.TargetRows: the
// rows of the chunk by the ChunkColumn, or, without one, the rows whose
// identities are in staging (join true).
func (c *PGCheck) fingerprintTarget(p *FingerprintProof, cols []string, a *SQLArgs) (q string, join bool, err error) {
	if c.scope.ChunkColumn == "" {
		p.TargetRows = "identities in staging"
		return c.FingerprintTargetSQL(cols, ""), true, nil
	}
	bounds, err := c.InChunk("t", a)
	if err != nil {
		return "", false, err
	}
	p.TargetRows = "ChunkColumn " + c.scope.ChunkColumn + " in " + c.scope.Chunk.String()
	return c.FingerprintTargetSQL(cols, bounds), false, nil
}

// unhashable returns why the fingerprint cannot cover cols: the first
// column whose type HashKind does not hash; "" when it can.
func (c *PGCheck) unhashable(cols []string) string {
	for _, n := range cols {
		if col := c.Cols[n]; HashKind(col) == "" {
			return fmt.Sprintf("column %q: no fingerprint for type %s", n, cmp.Or(col.Type, col.BaseType))
		}
	}
	return ""
}

// rememberFingerprint keeps p under key in the stager's memo (none: nil).
func rememberFingerprint(memo fingerprintKeeper, key string, p *FingerprintProof) {
	if memo != nil {
		memo.fingerprintMemo()[key] = p
	}
}

// fingerprintSettings returns the planner settings for the target rows'
// query ("" for none): hash joins for a large chunk that joins staging
// (join), sequential scans for a chunk by its ChunkColumn whose staging
// is at least half the target's size.
func (c *PGCheck) fingerprintSettings(ctx context.Context, tx sqlx.ExtContext, join bool) (string, error) {
	if join {
		large, err := c.largeChunk(ctx, tx)
		if err != nil {
			return "", err
		}
		if large {
			// A large chunk joins faster by hashing (see largeChunk).
			return `SELECT set_config('enable_hashjoin', 'on', true)`, nil
		}
		return "", nil
	}
	// A chunk whose staging is at least half the target's size holds
	// most of the target: a sequential scan (parallel where the
	// planner finds it worth it) reads it faster than the index on
	// the ChunkColumn, which the planner may still prefer when the
	// target's statistics predate the load (PostgreSQL docs, 15.1
	// "How Parallel Query Works"; a read-only query of a transaction
	// that wrote may run in parallel).
	most, err := c.stagingAtLeast(ctx, tx, 2)
	if err != nil {
		return "", err
	}
	if most {
		return `SELECT set_config('enable_indexscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`, nil
	}
	return "", nil
}

// runFingerprints runs q inside a savepoint that is rolled back and
// released afterwards, and sets p: the two fingerprints and Equal, or
// Error when a query failed. It returns the errors of the savepoint
// commands, and ctx's error when a query failed with ctx done.
func runFingerprints(ctx context.Context, tx sqlx.ExtContext, p *FingerprintProof, q fingerprintQueries) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT backfill_fingerprint`); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	qerr := queryFingerprints(ctx, tx, p, q)
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT backfill_fingerprint; RELEASE SAVEPOINT backfill_fingerprint`); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	if qerr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.Error = qerr.Error()
	} else {
		p.Equal = p.Staged == p.Target
	}
	return nil
}

// queryFingerprints pins the settings that change how values print, reads
// the staged rows' fingerprint into p.Staged, applies q.settings, and
// reads the target rows' fingerprint into p.Target; the caller's
// savepoint undoes the settings.
func queryFingerprints(ctx context.Context, tx sqlx.ExtContext, p *FingerprintProof, q fingerprintQueries) error {
	if _, err := tx.ExecContext(ctx, pinnedSettings); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	if err := sqlx.GetContext(ctx, tx, &p.Staged, q.staging); err != nil {
		return fmt.Errorf("staged rows: %w", err)
	}
	if q.settings != "" {
		// Undone with the savepoint.
		if _, err := tx.ExecContext(ctx, q.settings); err != nil {
			return err
		}
	}
	if err := sqlx.GetContext(ctx, tx, &p.Target, q.target, q.args...); err != nil {
		return fmt.Errorf("target rows: %w", err)
	}
	return nil
}

// provenBy returns the chunk's fingerprint proof when it shows the staged
// rows equal the chunk's target rows and covers every column of need
// (staged columns); otherwise nil, and the check runs its exact
// comparison. exact skips the proof.
func (c *PGCheck) provenBy(ctx context.Context, tx sqlx.ExtContext, exact bool, need ...string) (proof *FingerprintProof, ok bool, err error) {
	if exact {
		return nil, false, nil
	}
	cols := c.FingerprintColumns()
	for _, n := range need {
		if n != "" && !slices.Contains(cols, n) {
			return nil, false, nil
		}
	}
	p, err := c.fingerprints(ctx, tx)
	if err != nil {
		return nil, false, c.errorf("fingerprint: %w", err)
	}
	return p, p.Equal, nil
}
