package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Action is what a caller is about to do with the manifest; the
// privileges it needs, and the fix a [*PrivilegeError] names, depend on
// it.
type Action int

const (
	// ActionRun runs, resumes, validates and rolls back jobs: the
	// loader's privileges ([Manifest.Grants]).
	ActionRun Action = iota
	// ActionRead reads the manifest (status, events, exceptions, runs,
	// chunks, report, validations): USAGE on the schema and SELECT on its
	// tables, an operator role's ([Manifest.OperatorGrants]).
	ActionRead
	// ActionControl steers a run (pause, resume, cancel, set): USAGE on
	// the schema and EXECUTE on the control function, an operator role's.
	ActionControl
)

// readPrivilegesSQL lists the privileges to read the manifest (schema
// $1) that role $2 lacks: USAGE on the schema and SELECT on its tables.
const readPrivilegesSQL = `
WITH ns AS (SELECT oid, nspname, nspowner FROM pg_namespace WHERE nspname = $1),
want AS (
	SELECT 'SCHEMA' AS kind, nspname AS schema, '' AS name, 'USAGE' AS privilege, 'the manifest' AS why,
		has_schema_privilege($2::name, oid, 'USAGE') AS ok, 0 AS ord, pg_get_userbyid(nspowner) AS owner, '' AS args FROM ns
	UNION ALL
	SELECT 'TABLE', ns.nspname, c.relname, 'SELECT', 'reading the manifest', has_table_privilege($2::name, c.oid, 'SELECT'), 1, pg_get_userbyid(c.relowner), ''
	FROM pg_class c JOIN ns ON c.relnamespace = ns.oid WHERE c.relkind IN ('r', 'p') AND c.relname !~ '^stage_[0-9]+$')
SELECT kind, schema, name, privilege, why, owner, args FROM want WHERE ok IS FALSE
ORDER BY ord, name`

// controlPrivilegesSQL lists the privileges to execute the control
// functions of the manifest (schema $1) named in $3 (name and argument
// types, as in [ControlFunctions]) that role $2 lacks: USAGE on the
// schema and EXECUTE on each function. A function the schema does not
// have (an older version) is left out.
const controlPrivilegesSQL = `
WITH ns AS (SELECT oid, nspname, nspowner FROM pg_namespace WHERE nspname = $1),
want AS (
	SELECT 'SCHEMA' AS kind, nspname AS schema, '' AS name, 'USAGE' AS privilege, 'the manifest' AS why,
		has_schema_privilege($2::name, oid, 'USAGE') AS ok, 0 AS ord, pg_get_userbyid(nspowner) AS owner, '' AS args FROM ns
	UNION ALL
	SELECT 'FUNCTION', ns.nspname, p.proname, 'EXECUTE', 'the control functions',
		has_function_privilege($2::name, p.oid, 'EXECUTE'), 1, pg_get_userbyid(p.proowner), oidvectortypes(p.proargtypes)
	FROM pg_proc p JOIN ns ON p.pronamespace = ns.oid WHERE p.proname || '(' || oidvectortypes(p.proargtypes) || ')' = ANY ($3::text[]))
SELECT kind, schema, name, privilege, why, owner, args FROM want WHERE ok IS FALSE
ORDER BY ord, name, args`

// CheckAccess returns a [*PrivilegeError] (wrapping
// [backfilltype.ErrPrivilege]) listing the privileges on the manifest
// that the session's role lacks for action, and nil when it has them
// all: for [ActionRun] those of [Manifest.CheckPrivileges]; for
// [ActionRead] USAGE on the schema and SELECT on its tables; for
// [ActionControl] USAGE on the schema and EXECUTE on fns (control
// functions with their argument types, as in [ControlFunctions]; none:
// all of them). The error names the one fix for action. It runs one
// catalog query in a read-only transaction and needs no privilege itself.
func (m *Manifest) CheckAccess(ctx context.Context, db sqlx.ExtContext, action Action, fns ...string) error {
	if action == ActionRun {
		return m.CheckPrivileges(ctx, db)
	}
	ctx = m.purpose(ctx, "check privileges on the manifest", 0)
	var (
		rows []pgPrivilegeRow
		role string
	)
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := sqlx.GetContext(ctx, tx, &role, `SELECT current_user`); err != nil {
			return err
		}
		rows = nil
		if action == ActionRead {
			return sqlx.SelectContext(ctx, tx, &rows, readPrivilegesSQL, m.SchemaName, role)
		}
		if len(fns) == 0 {
			fns = ControlFunctions
		}
		return sqlx.SelectContext(ctx, tx, &rows, controlPrivilegesSQL, m.SchemaName, role, pq.Array(fns))
	})
	if err != nil {
		return fmt.Errorf("backfill: privileges on manifest %q: %w", m.SchemaName, err)
	}
	if len(rows) == 0 {
		return nil
	}
	return &PrivilegeError{Role: role, Missing: privilegeRows(rows, role), Action: action, Schema: m.SchemaName}
}

// VersionFor is [Manifest.Version] for a caller about to do action: a
// role that may not read the version gets the [*PrivilegeError] of
// [Manifest.CheckAccess] for action and fns.
func (m *Manifest) VersionFor(ctx context.Context, db sqlx.ExtContext, action Action, fns ...string) (current, latest int, err error) {
	ctx = m.purpose(ctx, "read the manifest's version", 0)
	err = ReadTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		current, latest, err = m.version(ctx, tx, action, fns...)
		return err
	})
	return current, latest, err
}

// readDenied returns, for an error of a read of the manifest refused for
// a missing privilege (SQLSTATE 42501), the [*PrivilegeError] of
// [ActionRead] wrapping it (when db, in an aborted transaction, cannot
// tell, the error as it is); other errors as they are.
func (m *Manifest) readDenied(ctx context.Context, db sqlx.ExtContext, err error) error {
	var pe *pq.Error
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return err
	}
	var perr *PrivilegeError
	if errors.As(m.CheckAccess(ctx, db, ActionRead), &perr) {
		return fmt.Errorf("%w (%w)", perr, err)
	}
	return err
}

// operatorFix is the fix of a [*PrivilegeError] of [ActionRead] or
// [ActionControl]: membership of an operator role.
func operatorFix(schema, role string) string {
	return fmt.Sprintf("these are an operator role's privileges: run as the manifest's owner: GRANT OPERATOR TO %s, where OPERATOR is an operator role (backfill migrate --schema %s --grant-operator OPERATOR makes one)",
		sqlgen.Ident(role), sqlgen.Ident(schema))
}

// operatorError is [PrivilegeError.Error] for [ActionRead] and
// [ActionControl]: the missing privileges grouped by privilege and kind,
// and the operator fix.
func (e *PrivilegeError) operatorError() string {
	var (
		b      strings.Builder
		groups []string
		names  = map[string][]string{}
	)
	for _, p := range e.Missing {
		kind, name, _ := strings.Cut(p.Object, " ")
		key := p.Privilege + " on " + kind
		if names[key] == nil {
			groups = append(groups, key)
		}
		names[key] = append(names[key], name)
	}
	fmt.Fprintf(&b, "%v: role %s lacks ", backfilltype.ErrPrivilege, sqlgen.Ident(e.Role))
	for i, key := range groups {
		if i > 0 {
			b.WriteString(", ")
		}
		noun := key
		if len(names[key]) > 1 {
			noun += "s" // schemas, tables, functions
		}
		b.WriteString(noun + " " + strings.Join(names[key], ", "))
	}
	what := "to read the manifest"
	if e.Action == ActionControl {
		what = "to run the control functions"
	}
	b.WriteString(" " + what + "; " + operatorFix(e.Schema, e.Role))
	return b.String()
}
