package backfill

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// SplitTableName splits a table name of the form [Target.Table] accepts
// into its schema ("" when the name has none) and table, unquoted. It
// returns an error wrapping [ErrInvalidConfig] for a name that could mean
// more than one table (more than one dot outside double quotes) or is
// malformed (an empty part, an unterminated quote, a quote inside an
// unquoted part). Mergers call it before looking the table up.
func SplitTableName(name string) (schema, table string, err error) {
	schema, table, err = sqlgen.ParseTable(name)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return schema, table, nil
}

// ReservedPrefix begins every name that the library's generated SQL gives
// to a column of its own (the staging table's row number) or to a
// subquery's computed column, so that none can collide with a user's
// column. A staged column (written, key, computed or lineage) whose name
// begins with it is refused by [ResolveTarget] with an error wrapping
// [ErrInvalidConfig]. Every other generated name is a table alias that
// the SQL only uses to qualify columns (t."n", never a bare n) or as a
// whole-row reference written t.*, which no column name can shadow.
const ReservedPrefix = "_backfill_"

// validate checks what can be checked without the table.
func (t Target) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format+" (target %q)", append([]any{ErrInvalidConfig}, append(args, t.Table)...)...)
	}
	if t.Table == "" {
		return fmt.Errorf("%w: Target.Table is required", ErrInvalidConfig)
	}
	if _, _, err := sqlgen.ParseTable(t.Table); err != nil {
		return fmt.Errorf("%w: Target.Table: %w", ErrInvalidConfig, err)
	}
	if len(t.Key) == 0 {
		return bad("Target.Key is required")
	}
	all := append(append(slices.Clone(t.Key), t.Columns...), t.Version, t.ValidFrom, t.ValidTo, t.HashColumn)
	for i, c := range all {
		if c == "" && i < len(t.Key)+len(t.Columns) {
			return bad("empty column name")
		}
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		if seen[c] {
			return bad("column %q repeated in Target.Columns", c)
		}
		seen[c] = true
	}
	switch t.Mode {
	case "", Upsert, AppendOnly, History, Keyless:
	default:
		return bad("Target.Mode %q is not supported", t.Mode)
	}
	switch t.Duplicates {
	case "", KeepLast, KeepFirst:
	default:
		return bad("Target.Duplicates %q is not supported", t.Duplicates)
	}
	switch t.Conflict {
	case "", SourceWins, TargetWins:
	case NewerVersionWins:
		if t.Version == "" {
			return bad("Target.Version is required with NewerVersionWins")
		}
	default:
		return bad("Target.Conflict %q is not supported", t.Conflict)
	}
	if t.Conflict != "" && t.Mode != "" && t.Mode != Upsert {
		return bad("Target.Conflict applies to Upsert mode only, not %s", t.Mode)
	}
	if len(t.Derive) > 0 && t.Mode != Keyless {
		return bad("Target.Derive applies to Keyless mode only")
	}
	return nil
}

// ResolveTarget checks t against a table and fills in its defaults. It is
// shared by [PGMerger] and the fakes of backfilltest so that both accept
// and refuse the same targets.
//
// table lists the table's writable columns in table order (Name, and, when
// known, Type, BaseType, MaxLen, NotNull; generated and identity-always
// columns excluded). unique lists the column sets of the table's unique
// indexes and constraints. The result's Columns are the written columns
// (Target.Columns, or by default every table column except derived keys,
// ValidTo and HashColumn) followed by the computed ones.
//
// Errors: [ErrInvalidConfig] for an inconsistent Target,
// [ErrTargetNotFound] for a column the table lacks, [ErrNoUniqueKey] when
// no unique index covers exactly the identity (Key; in History mode Key
// plus ValidFrom).
func ResolveTarget(t Target, table []Column, unique [][]string) (TableInfo, error) {
	if err := t.validate(); err != nil {
		return TableInfo{}, err
	}
	t.Mode = cmpOr(t.Mode, Upsert)
	t.Duplicates = cmpOr(t.Duplicates, KeepLast)
	if t.Mode == Upsert {
		t.Conflict = cmpOr(t.Conflict, SourceWins)
	}
	if t.Mode == History {
		t.ValidFrom = cmpOr(t.ValidFrom, "valid_from")
		t.ValidTo = cmpOr(t.ValidTo, "valid_to")
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format+" (target %q)", append([]any{ErrInvalidConfig}, append(args, t.Table)...)...)
	}
	byName := map[string]Column{}
	for _, c := range table {
		byName[c.Name] = c
	}
	col := func(name, role string) (Column, error) {
		c, ok := byName[name]
		if !ok {
			return Column{}, fmt.Errorf("backfill: prepare: %s column %q of table %q: %w", role, name, t.Table, ErrTargetNotFound)
		}
		return c, nil
	}
	derived := map[string]KeyRule{}
	for _, r := range t.Derive {
		if _, dup := derived[r.Column]; dup {
			return TableInfo{}, bad("two Derive rules for key column %q", r.Column)
		}
		if !slices.Contains(t.Key, r.Column) {
			return TableInfo{}, bad("Derive rule for %q, which is not a Key column", r.Column)
		}
		derived[r.Column] = r
	}
	if t.Mode == Keyless {
		for _, k := range t.Key {
			if _, ok := derived[k]; !ok {
				return TableInfo{}, bad("Keyless mode needs a Derive rule for key column %q", k)
			}
		}
	}
	if !t.Lineage.Off {
		if _, ok := byName["backfill_inserted_by"]; ok && t.Lineage.InsertedBy == "" {
			t.Lineage.InsertedBy = "backfill_inserted_by"
		}
		if _, ok := byName["backfill_updated_by"]; ok && t.Lineage.UpdatedBy == "" {
			t.Lineage.UpdatedBy = "backfill_updated_by"
		}
	} else {
		t.Lineage.InsertedBy, t.Lineage.UpdatedBy = "", ""
	}
	computed := func(name string) bool {
		_, d := derived[name]
		return d || name == t.HashColumn || name == t.IngestedAt || (t.Mode == History && name == t.ValidTo) ||
			(name != "" && (name == t.Lineage.InsertedBy || name == t.Lineage.UpdatedBy))
	}
	if len(t.Columns) == 0 {
		for _, c := range table {
			if !computed(c.Name) {
				t.Columns = append(t.Columns, c.Name)
			}
		}
	}
	info := TableInfo{Target: t}
	for _, name := range t.Columns {
		if computed(name) {
			return TableInfo{}, bad("column %q is filled by the library and must not be in Target.Columns", name)
		}
		c, err := col(name, "written")
		if err != nil {
			return TableInfo{}, err
		}
		c.Key = slices.Contains(t.Key, name)
		c.Computed = ""
		info.Columns = append(info.Columns, c)
	}
	info.Written = len(info.Columns)
	for _, k := range t.Key {
		if _, ok := derived[k]; ok {
			continue
		}
		if !slices.Contains(t.Columns, k) {
			return TableInfo{}, bad("key column %q is not in Target.Columns", k)
		}
	}
	for _, k := range t.Key {
		r, ok := derived[k]
		if !ok {
			continue
		}
		if !slices.Contains(t.Columns, r.From) {
			return TableInfo{}, bad("Derive source %q of key column %q is not in Target.Columns", r.From, k)
		}
		c, err := col(k, "derived key")
		if err != nil {
			return TableInfo{}, err
		}
		c.Key, c.Computed = true, "derive"
		info.Columns = append(info.Columns, c)
	}
	if t.HashColumn != "" {
		c, err := col(t.HashColumn, "hash")
		if err != nil {
			return TableInfo{}, err
		}
		if c.BaseType != "" && c.BaseType != "bytea" && c.BaseType != "text" && c.BaseType != "varchar" {
			return TableInfo{}, bad("HashColumn %q must be bytea or text, not %s", t.HashColumn, c.Type)
		}
		c.Key, c.Computed = false, "hash"
		info.Columns = append(info.Columns, c)
	}
	if t.IngestedAt != "" {
		c, err := col(t.IngestedAt, "ingested_at")
		if err != nil {
			return TableInfo{}, err
		}
		if c.BaseType != "" && c.BaseType != "timestamptz" {
			return TableInfo{}, bad("IngestedAt %q must be timestamptz, not %s", t.IngestedAt, c.Type)
		}
		c.Key, c.Computed = false, "ingested"
		info.Columns = append(info.Columns, c)
	}
	for _, l := range []struct{ name, role string }{{t.Lineage.InsertedBy, "inserted_by"}, {t.Lineage.UpdatedBy, "updated_by"}} {
		if l.name == "" {
			continue
		}
		c, err := col(l.name, "lineage "+l.role)
		if err != nil {
			return TableInfo{}, err
		}
		if c.BaseType != "" && c.BaseType != "int8" {
			return TableInfo{}, bad("lineage column %q must be bigint, not %s", l.name, c.Type)
		}
		c.Key, c.Computed = false, l.role
		info.Columns = append(info.Columns, c)
	}
	identity := slices.Clone(t.Key)
	switch t.Mode {
	case History:
		if slices.Contains(t.Key, t.ValidFrom) {
			return TableInfo{}, bad("ValidFrom %q must not be in Key: the version identity is Key plus ValidFrom", t.ValidFrom)
		}
		if !slices.Contains(t.Columns, t.ValidFrom) {
			return TableInfo{}, bad("ValidFrom %q must be in Target.Columns", t.ValidFrom)
		}
		vf, _ := col(t.ValidFrom, "valid_from")
		vt, err := col(t.ValidTo, "valid_to")
		if err != nil {
			return TableInfo{}, err
		}
		if vt.NotNull {
			return TableInfo{}, bad("ValidTo %q must be nullable: NULL marks the current version", t.ValidTo)
		}
		if vf.Type != vt.Type {
			return TableInfo{}, bad("ValidFrom %q (%s) and ValidTo %q (%s) must have the same type", t.ValidFrom, vf.Type, t.ValidTo, vt.Type)
		}
		identity = append(identity, t.ValidFrom)
		// A version without a start has no place in the tiling, and a NULL
		// never matches itself in the merge's lookups: the row writer
		// rejects it like a NULL in a NOT NULL column.
		for i := range info.Columns {
			if info.Columns[i].Name == t.ValidFrom {
				info.Columns[i].NotNull = true
			}
		}
	}
	if t.Conflict == NewerVersionWins {
		if !slices.Contains(t.Columns, t.Version) || slices.Contains(t.Key, t.Version) {
			return TableInfo{}, bad("Version %q must be a non-key column of Target.Columns", t.Version)
		}
	}
	for _, c := range info.Columns {
		if strings.HasPrefix(c.Name, ReservedPrefix) {
			return TableInfo{}, bad("column %q: names beginning with %q are reserved for the columns and aliases the library's SQL adds", c.Name, ReservedPrefix)
		}
	}
	want := slices.Sorted(slices.Values(identity))
	for _, u := range unique {
		if slices.Equal(slices.Sorted(slices.Values(u)), want) {
			return info, nil
		}
	}
	return TableInfo{}, fmt.Errorf("backfill: prepare: table %q key (%s): %w", t.Table, strings.Join(identity, ", "), ErrNoUniqueKey)
}
