package pgstore

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
	"github.com/pgbackfill/backfill/internal/suggest"
)

// SplitTableName splits a table name of the form
// [backfilltype.Target.Table] accepts into its schema ("" when the name has
// none) and table, unquoted. It returns an error wrapping
// [backfilltype.ErrInvalidConfig] for a name that could mean more than one
// table (more than one dot outside double quotes) or is malformed (an empty
// part, an unterminated quote, a quote inside an unquoted part). Mergers
// call it before looking the table up.
func SplitTableName(name string) (schema, table string, err error) {
	schema, table, err = sqlgen.ParseTable(name)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", backfilltype.ErrInvalidConfig, err)
	}
	return schema, table, nil
}

// ReservedPrefix begins every name that the library's generated SQL gives
// to a column of its own (the staging table's row number) or to a
// subquery's computed column, so that none can collide with a user's
// column. A staged column (written, key, computed or lineage) whose name
// begins with it is refused by [ResolveTarget] with an error wrapping
// [backfilltype.ErrInvalidConfig]. Every other generated name is a table
// alias that the SQL only uses to qualify columns (t."n", never a bare n)
// or as a whole-row reference written t.*, which no column name can shadow.
const ReservedPrefix = "_backfill_"

// ResolveTarget checks t against a table and fills in its defaults. It is
// shared by [Merger] and the fakes of backfilltest so that both accept
// and refuse the same targets.
//
// table lists the table's writable columns in table order (Name, and, when
// known, Type, BaseType, MaxLen, NotNull; generated and identity-always
// columns excluded). unique lists the column sets of the table's unique
// indexes and constraints. The result's Columns are the written columns
// (Target.Columns, or by default every table column except derived keys,
// ValidTo and HashColumn) followed by the computed ones.
//
// Errors: [backfilltype.ErrInvalidConfig] for an inconsistent Target,
// [backfilltype.ErrTargetNotFound] for a column the table lacks,
// [backfilltype.ErrNoUniqueKey] when no unique index covers exactly the
// identity (Key; in History mode Key plus ValidFrom).
func ResolveTarget(t backfilltype.Target, table []backfilltype.Column, unique [][]string) (backfilltype.TableInfo, error) {
	if err := t.Validate(); err != nil {
		return backfilltype.TableInfo{}, err
	}
	r := &targetResolver{t: t.WithDefaults(), table: table, byName: map[string]backfilltype.Column{}}
	for _, c := range table {
		r.byName[c.Name] = c
	}
	if err := r.deriveRules(); err != nil {
		return backfilltype.TableInfo{}, err
	}
	r.lineageDefaults()
	for _, phase := range []func() error{r.writtenColumns, r.derivedKeys, r.computedColumns, r.historyColumns, r.version, r.reservedNames} {
		if err := phase(); err != nil {
			return backfilltype.TableInfo{}, err
		}
	}
	if err := r.uniqueIndex(unique); err != nil {
		return backfilltype.TableInfo{}, err
	}
	return r.info, nil
}

// targetResolver carries ResolveTarget's phases: each checks one part of
// the target against the table and adds its columns to info.
type targetResolver struct {
	t       backfilltype.Target   // with defaults
	table   []backfilltype.Column // the table's columns, in table order
	byName  map[string]backfilltype.Column
	derived map[string]backfilltype.KeyRule // by key column
	info    backfilltype.TableInfo
}

// bad is an error wrapping ErrInvalidConfig that names the target.
func (r *targetResolver) bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format+" (target %q)", append([]any{backfilltype.ErrInvalidConfig}, append(args, r.t.Table)...)...)
}

// col returns the table's column name, which the target uses as role.
func (r *targetResolver) col(name, role string) (backfilltype.Column, error) {
	c, ok := r.byName[name]
	if !ok {
		return backfilltype.Column{}, r.missing(name, role)
	}
	return c, nil
}

// missing is the error for a column name the target uses as role and the
// table lacks: it wraps ErrTargetNotFound, lists the table's columns and
// suggests the closest.
func (r *targetResolver) missing(name, role string) error {
	names := make([]string, len(r.table))
	for i, c := range r.table {
		names[i] = c.Name
	}
	return fmt.Errorf("backfill: prepare: %s column %q of table %q: %w: no such writable column (generated and identity-always columns are not written); %s",
		role, name, r.t.Table, backfilltype.ErrTargetNotFound, suggest.List("the table's writable columns are", name, names))
}

// exists returns the missing error when the table lacks column name, which
// the target uses as role; nil for "" (not set).
func (r *targetResolver) exists(name, role string) error {
	if _, ok := r.byName[name]; ok || name == "" {
		return nil
	}
	return r.missing(name, role)
}

// deriveRules indexes the Derive rules by key column: at most one per
// column, of a Key column, and one for every key column in Keyless mode.
func (r *targetResolver) deriveRules() error {
	r.derived = map[string]backfilltype.KeyRule{}
	for _, k := range r.t.Derive {
		if _, dup := r.derived[k.Column]; dup {
			return r.bad("two Derive rules for key column %q", k.Column)
		}
		if !slices.Contains(r.t.Key, k.Column) {
			if err := r.exists(k.Column, "Derive rule's key"); err != nil {
				return err
			}
			return r.bad("Derive rule for %q, which is not a Key column", k.Column)
		}
		r.derived[k.Column] = k
	}
	if r.t.Mode == backfilltype.Keyless {
		for _, k := range r.t.Key {
			if _, ok := r.derived[k]; !ok {
				return r.bad("Keyless mode needs a Derive rule for key column %q", k)
			}
		}
	}
	return nil
}

// lineageDefaults names the lineage columns backfill_inserted_by and
// backfill_updated_by when the table has them and the target names none,
// and none at all when lineage is off.
func (r *targetResolver) lineageDefaults() {
	l := &r.t.Lineage
	if l.Off {
		l.InsertedBy, l.UpdatedBy = "", ""
		return
	}
	if _, ok := r.byName["backfill_inserted_by"]; ok && l.InsertedBy == "" {
		l.InsertedBy = "backfill_inserted_by"
	}
	if _, ok := r.byName["backfill_updated_by"]; ok && l.UpdatedBy == "" {
		l.UpdatedBy = "backfill_updated_by"
	}
}

// computed reports whether the library fills column name.
func (r *targetResolver) computed(name string) bool {
	t := r.t
	_, d := r.derived[name]
	return d || name == t.HashColumn || name == t.IngestedAt || (t.Mode == backfilltype.History && name == t.ValidTo) ||
		(name != "" && (name == t.Lineage.InsertedBy || name == t.Lineage.UpdatedBy))
}

// writtenColumns resolves the columns the extractor writes:
// Target.Columns, or by default every table column the library does not
// fill. Every key column that is not derived must be among them.
func (r *targetResolver) writtenColumns() error {
	if len(r.t.Columns) == 0 {
		for _, c := range r.table {
			if !r.computed(c.Name) {
				r.t.Columns = append(r.t.Columns, c.Name)
			}
		}
	}
	r.info.Target = r.t
	for _, name := range r.t.Columns {
		if r.computed(name) {
			return r.bad("column %q is filled by the library and must not be in Target.Columns", name)
		}
		c, err := r.col(name, "written")
		if err != nil {
			return err
		}
		c.Key = slices.Contains(r.t.Key, name)
		c.Computed = ""
		r.info.Columns = append(r.info.Columns, c)
	}
	r.info.Written = len(r.info.Columns)
	for _, k := range r.t.Key {
		_, derived := r.derived[k]
		if derived {
			continue // derivedKeys checks it
		}
		if err := r.exists(k, "key"); err != nil {
			return err
		}
		if !slices.Contains(r.t.Columns, k) {
			return r.bad("key column %q is not in Target.Columns", k)
		}
	}
	return nil
}

// derivedKeys adds the key columns derived from a written column (Keyless
// mode), in Key order.
func (r *targetResolver) derivedKeys() error {
	for _, k := range r.t.Key {
		rule, ok := r.derived[k]
		if !ok {
			continue
		}
		if !slices.Contains(r.t.Columns, rule.From) {
			if err := r.exists(rule.From, "Derive source"); err != nil {
				return err
			}
			return r.bad("Derive source %q of key column %q is not in Target.Columns", rule.From, k)
		}
		c, err := r.col(k, "derived key")
		if err != nil {
			return err
		}
		c.Key, c.Computed = true, "derive"
		r.info.Columns = append(r.info.Columns, c)
	}
	return nil
}

// computedColumns adds the other columns the library fills, each of a
// type that holds its value: HashColumn, IngestedAt and the lineage
// columns.
func (r *targetResolver) computedColumns() error {
	t := r.t
	for _, f := range []struct {
		name, role, computed string
		types                []string // the base types allowed, besides "" (unknown)
		what                 string   // the field and the types, for errors
	}{
		{t.HashColumn, "hash", "hash", []string{"bytea", "text", "varchar"}, "HashColumn %q must be bytea or text, not %s"},
		{t.IngestedAt, "ingested_at", "ingested", []string{"timestamptz"}, "IngestedAt %q must be timestamptz, not %s"},
		{t.Lineage.InsertedBy, "lineage inserted_by", "inserted_by", []string{"int8"}, "lineage column %q must be bigint, not %s"},
		{t.Lineage.UpdatedBy, "lineage updated_by", "updated_by", []string{"int8"}, "lineage column %q must be bigint, not %s"},
	} {
		if f.name == "" {
			continue
		}
		c, err := r.col(f.name, f.role)
		if err != nil {
			return err
		}
		if c.BaseType != "" && !slices.Contains(f.types, c.BaseType) {
			return r.bad(f.what, f.name, c.Type)
		}
		c.Key, c.Computed = false, f.computed
		r.info.Columns = append(r.info.Columns, c)
	}
	return nil
}

// historyColumns checks, in History mode, the interval columns: ValidFrom
// written and not a key, ValidTo nullable and of the same type. A version
// without a start has no place in the tiling, and a NULL never matches
// itself in the merge's lookups: the row writer rejects it like a NULL in
// a NOT NULL column.
func (r *targetResolver) historyColumns() error {
	t := r.t
	if t.Mode != backfilltype.History {
		return nil
	}
	if err := r.exists(t.ValidFrom, "valid_from"); err != nil {
		return err
	}
	if slices.Contains(t.Key, t.ValidFrom) {
		return r.bad("ValidFrom %q must not be in Key: the version identity is Key plus ValidFrom", t.ValidFrom)
	}
	if !slices.Contains(t.Columns, t.ValidFrom) {
		return r.bad("ValidFrom %q must be in Target.Columns", t.ValidFrom)
	}
	vf, _ := r.col(t.ValidFrom, "valid_from")
	vt, err := r.col(t.ValidTo, "valid_to")
	if err != nil {
		return err
	}
	if vt.NotNull {
		return r.bad("ValidTo %q must be nullable: NULL marks the current version", t.ValidTo)
	}
	if vf.Type != vt.Type {
		return r.bad("ValidFrom %q (%s) and ValidTo %q (%s) must have the same type", t.ValidFrom, vf.Type, t.ValidTo, vt.Type)
	}
	for i := range r.info.Columns {
		if r.info.Columns[i].Name == t.ValidFrom {
			r.info.Columns[i].NotNull = true
		}
	}
	return nil
}

// version checks that NewerVersionWins compares a written non-key column.
func (r *targetResolver) version() error {
	t := r.t
	if t.Conflict != backfilltype.NewerVersionWins {
		return nil
	}
	if err := r.exists(t.Version, "version"); err != nil {
		return err
	}
	if !slices.Contains(t.Columns, t.Version) || slices.Contains(t.Key, t.Version) {
		return r.bad("Version %q must be a non-key column of Target.Columns", t.Version)
	}
	return nil
}

// reservedNames refuses staged columns whose names begin with
// ReservedPrefix.
func (r *targetResolver) reservedNames() error {
	for _, c := range r.info.Columns {
		if strings.HasPrefix(c.Name, ReservedPrefix) {
			return r.bad("column %q: names beginning with %q are reserved for the columns and aliases the library's SQL adds", c.Name, ReservedPrefix)
		}
	}
	return nil
}

// uniqueIndex checks that one of unique, the column sets of the table's
// unique indexes and constraints, is exactly the version identity: Key,
// plus ValidFrom in History mode.
func (r *targetResolver) uniqueIndex(unique [][]string) error {
	identity := slices.Clone(r.t.Key)
	if r.t.Mode == backfilltype.History {
		identity = append(identity, r.t.ValidFrom)
	}
	want := slices.Sorted(slices.Values(identity))
	for _, u := range unique {
		if slices.Equal(slices.Sorted(slices.Values(u)), want) {
			return nil
		}
	}
	return fmt.Errorf("backfill: prepare: table %q key (%s): %w", r.t.Table, strings.Join(identity, ", "), backfilltype.ErrNoUniqueKey)
}
