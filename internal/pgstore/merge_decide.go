package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// What the merge decides from. Change detection must tell apart every two
// values stored differently: only the types in exactTypes keep their own
// equality; every other column is compared byte for byte ([ExactCompare]).
// Before the deciding statement, one statement of its own locks FOR
// UPDATE the target rows the merge would change ([PGStager.lockChanging]),
// so that the decision, taken in a new snapshot, cannot be overtaken by a
// concurrent writer of those rows; unchanged rows are not locked. Every
// merge ends with SET CONSTRAINTS ALL IMMEDIATE inside its savepoint
// ([PGStager.checkDeferred]), so that deferred checks fire where refused
// rows can be isolated. The design note docs/design/merge.md explains the
// alternatives.

// LooseEquality lists the built-in types whose equality operator equates
// values stored differently; they are compared by their text.
var LooseEquality = map[string]bool{"numeric": true, "float4": true, "float8": true, "interval": true, "jsonb": true}

// exactTypes lists the built-in base types whose default equality holds
// only between values stored alike: integers, identifiers, booleans,
// uuids, bytes, bit strings, times and timestamps (one stored form per
// instant), addresses, and text types under a deterministic collation,
// whose equality compares bytes (PostgreSQL docs, 24.2.2.4
// "Nondeterministic Collations"). Only these, and enums (whose labels
// are compared by OID), arrays of them, keep their own equality in the
// merge's change detection; everything else (numerics, floats,
// intervals, jsonb, ranges, composites, types of extensions or users,
// arrays of any of them, text under a collation of its own) is compared
// byte for byte by ExactCompare. An allow list, not a deny list: a type
// not known to be exact is treated as loose.
var exactTypes = map[string]bool{
	"int2": true, "int4": true, "int8": true, "oid": true, "bool": true, "uuid": true, "bytea": true,
	"bit": true, "varbit": true, "char": true, "money": true, "pg_lsn": true, "xid8": true,
	"date": true, "time": true, "timetz": true, "timestamp": true, "timestamptz": true,
	"inet": true, "cidr": true, "macaddr": true, "macaddr8": true,
	"text": true, "varchar": true, "bpchar": true, "name": true,
	"regproc": true, "regprocedure": true, "regoper": true, "regoperator": true, "regclass": true,
	"regtype": true, "regrole": true, "regnamespace": true, "regconfig": true, "regdictionary": true,
	"regcollation": true,
}

// exactEquality reports whether column c's own equality tells apart every
// two values stored differently (see exactTypes). An array is judged by
// its element type (resolved through domains by Prepare); a collatable
// type only under its type's default collation (Collation ""). A column
// whose type is unknown (BaseType "") is not.
func exactEquality(c backfilltype.Column) bool {
	base, kind, user := c.BaseType, c.Kind, c.UserType
	if strings.HasPrefix(base, "_") && (c.ElemKind != "" || kind == "") {
		base, kind, user = base[1:], c.ElemKind, c.UserElem
	}
	switch {
	case kind == "e":
		return true
	case base == "bpchar" && (base != c.BaseType || c.MaxLen == 0):
		// Trailing spaces are insignificant to bpchar's equality; only a
		// char(n) column, which pads every value to n, stores one form.
		return false
	case user || kind != "" && kind != "b" || TextCompared[base]:
		return false
	case collatable[base] && c.Collation != "":
		return false
	}
	return exactTypes[base]
}

// ExactCompare returns the expression e, a value of column c, in a form
// whose equality is byte for byte (see above): e itself for types whose
// equality is exact (exactEquality), floats and arrays of floats by their
// binary form, text of a collation of its own under "C", anything else
// by its text under "C".
func ExactCompare(c backfilltype.Column, e string) string {
	switch {
	case c.BaseType == "float8" || c.BaseType == "float4":
		// The binary form (typsend): exact whatever extra_float_digits a
		// session sets (a check may run under SET LOCAL 0, which rounds
		// the text), -0 apart from 0.
		return c.BaseType + "send(" + e + ")"
	case (c.BaseType == "_float8" || c.BaseType == "_float4") && !c.UserElem:
		return "array_send(" + e + ")"
	case exactEquality(c):
		return e
	case c.Collation != "" && collatable[c.BaseType] && !c.TextCompare && c.BaseType != "bpchar":
		return "(" + e + ` COLLATE "C")`
	}
	return "(" + textForm(c, e) + ` COLLATE "C")`
}

// textForm returns the expression e, a value of column c, as text by its
// type's output function: e::text, but for bpchar, whose cast to text
// drops trailing spaces, the output itself.
func textForm(c backfilltype.Column, e string) string {
	if c.BaseType == "bpchar" {
		return "textin(bpcharout(" + e + "))"
	}
	return e + "::text"
}

// comparedAsText reports whether Prepare's column, of base type base
// (kind its typtype), array element type elem (elemKind), is compared
// by its text: types without an equality operator, types whose equality
// is looser than their stored form, and ranges, arrays or composites
// that may hold them.
func comparedAsText(base, kind, elem, elemKind string) bool {
	return TextCompared[base] || TextCompared[elem] || LooseEquality[base] || LooseEquality[elem] ||
		kind == "c" || kind == "r" || kind == "m" || elemKind == "c" || elemKind == "r" || elemKind == "m"
}

// prepareDecide reads what Prepare records for the merge's decision: the
// partition root naming the key locks; and, for the target fingerprints
// of replays, whether they may hash tuple identities
// (TupleIdentity: the target and each of its partitions are heap tables,
// hashtidextended is there, PostgreSQL 14, and every column is of a
// built-in base type whose values no catalog lookup reads).
//
// Why the types: a row version reads as another value, without a write,
// when what it reads as lives in the catalog: an enum's label renamed, a
// user type's output changed. Such columns are hashed by value. (A
// column dropped and added again, or two names swapped, is caught by the
// shape the fingerprint's statement reads: tupleShapeSQL.)
func prepareDecide(ctx context.Context, db sqlx.ExtContext, oid int64, info *backfilltype.TableInfo) error {
	var r struct {
		Schema      string `db:"nspname"`
		Name        string `db:"relname"`
		Heap        bool   `db:"heap"`
		Partitioned bool   `db:"partitioned"`
	}
	err := sqlx.GetContext(ctx, db, &r, `SELECT n.nspname, c.relname,
			(SELECT t.relkind = 'p' FROM pg_class t WHERE t.oid = $1) AS partitioned,
			coalesce((SELECT bool_and(p.relkind = 'p' OR p.relkind = 'r' AND am.amname = 'heap')
				FROM pg_class p LEFT JOIN pg_am am ON am.oid = p.relam
				WHERE p.oid = $1 OR p.oid IN (SELECT relid FROM pg_partition_tree($1::oid::regclass))), false)
				AND to_regprocedure('hashtidextended(tid,bigint)') IS NOT NULL AS heap
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = coalesce(pg_partition_root($1::oid::regclass), $1::oid::regclass)`, oid)
	if err != nil {
		return err
	}
	info.LockRoot = sqlgen.Qualified(r.Schema, r.Name)
	info.TupleIdentity, info.Partitioned = r.Heap && builtinBaseTypes(info.Columns), r.Partitioned
	return nil
}

// builtinBaseTypes reports whether every column of cols is of a built-in
// base type, or an array or domain of one, other than the reg* types
// (not an enum, composite, range, or a type of an extension or a user).
func builtinBaseTypes(cols []backfilltype.Column) bool {
	for _, c := range cols {
		if c.Kind != "b" || c.UserType || c.ElemKind != "" && (c.ElemKind != "b" || c.UserElem) || CatalogLookup(c) {
			return false
		}
	}
	return true
}

// CatalogLookup reports whether column c is of a built-in reg* type
// (regclass, regtype, ...) or an array or domain of one: its stored value
// is an OID that its input looked up by name in the catalog.
func CatalogLookup(c backfilltype.Column) bool {
	if strings.HasPrefix(c.BaseType, "_") && c.ElemKind != "" {
		return !c.UserElem && regTypes[c.BaseType[1:]]
	}
	return !c.UserType && regTypes[c.BaseType]
}

// regTypes are the built-in OID alias types (PostgreSQL docs, 8.19
// "Object Identifier Types").
var regTypes = map[string]bool{"regclass": true, "regcollation": true, "regconfig": true, "regdictionary": true,
	"regnamespace": true, "regoper": true, "regoperator": true, "regproc": true, "regprocedure": true,
	"regrole": true, "regtype": true}

// lockChanging locks the target rows the merge would change (see above),
// before the deciding statement. For Upsert it also reports whether the
// n staged rows are settled: all found in the target and unchanged, so
// that the upsert has nothing to do ([mergeShape.upsertLockChanging]).
func (s *PGStager) lockChanging(ctx context.Context, n int64) (settled bool, err error) {
	if s.Q.lockChanging == "" {
		return false, nil
	}
	q := s.Q.lockChanging
	if s.Q.Upsert != "" {
		q += strconv.FormatInt(n, 10)
	}
	r, err := s.tx.ExecContext(ctx, q)
	if err != nil {
		return false, fmt.Errorf("backfill: merge %s: lock rows to change: %w", s.Info.Target.Table, s.classify(err))
	}
	if s.Q.Upsert == "" {
		return false, nil
	}
	// The command tag of the last statement of the simple query: the
	// rows upsertLockChanging returned.
	rows, err := r.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("backfill: merge %s: lock rows to change: %w", s.Info.Target.Table, err)
	}
	return rows == 0, nil
}

// checkDeferred fires the pending checks of deferred constraints,
// wherever they are (see above), inside the merge's savepoint.
func (s *PGStager) checkDeferred(ctx context.Context) error {
	if _, err := s.tx.ExecContext(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
		return fmt.Errorf("backfill: merge %s: deferred constraints: %w", s.Info.Target.Table, s.classify(err))
	}
	return nil
}

// statementTrigger returns a non-retryable error naming the trigger when
// pe, a refusal, was raised by a statement-level trigger of the target:
// such a trigger refuses the statement, not a row, and bisecting would
// blame every row in turn. nil otherwise. Called after the rollback to
// the merge's savepoint, when the transaction can read the catalog.
func (s *PGStager) statementTrigger(ctx context.Context, pe *pq.Error, err error) error {
	m := plpgsqlContext.FindAllStringSubmatch(pe.Where, -1)
	if len(m) == 0 {
		return nil
	}
	fn := m[len(m)-1][1] // the outermost function
	if i := strings.LastIndexByte(fn, '.'); i >= 0 {
		fn = fn[i+1:]
	}
	var tg []struct {
		Name string `db:"tgname"`
		Row  bool   `db:"row"`
	}
	// tgtype bit 0 is TRIGGER_TYPE_ROW (src/include/catalog/pg_trigger.h).
	if qerr := sqlx.SelectContext(ctx, s.tx, &tg, `SELECT tg.tgname::text AS tgname, tg.tgtype::int & 1 = 1 AS row
		FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
		WHERE tg.tgrelid = to_regclass($1) AND NOT tg.tgisinternal AND p.proname = $2 ORDER BY 1`,
		sqlgen.Table(s.Info.Target.Table), fn); qerr != nil {
		return errors.Join(err, qerr)
	}
	var names []string
	for _, t := range tg {
		if t.Row {
			return nil // a row trigger calls it too: it may be about a row
		}
		names = append(names, strconv.Quote(t.Name))
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("backfill: merge %s: statement-level trigger %s refused the merge, not a row (%s): %w: %w",
		s.Info.Target.Table, strings.Join(names, ", "), pe.Message, backfilltype.ErrNotRetryable, err)
}
