package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgurl"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PrivilegeError lists every privilege the session's role lacks for what
// it is about to do (Action), with the fix. It wraps
// [backfilltype.ErrPrivilege].
type PrivilegeError struct {
	// Role is the session's role (current_user).
	Role string
	// Missing lists the missing privileges, in a stable order.
	Missing []backfilltype.Privilege
	// Action is what the role was about to do: [ActionRun] (the zero
	// value, a loader's job), [ActionRead] or [ActionControl] (an
	// operator's).
	Action Action
	// Schema is the manifest's schema, named by the fix of [ActionRead]
	// and [ActionControl].
	Schema string
}

// Error names the role, each missing privilege with its object and the
// fix: for [ActionRun], what needs each privilege and the GRANT
// statements to run; for [ActionRead] and [ActionControl], membership of
// an operator role (backfill migrate --grant-operator).
func (e *PrivilegeError) Error() string {
	if e.Action != ActionRun {
		return e.operatorError()
	}
	var b strings.Builder
	noun := "privileges"
	if len(e.Missing) == 1 {
		noun = "privilege"
	}
	fmt.Fprintf(&b, "%v: role %s lacks %d %s:", backfilltype.ErrPrivilege, sqlgen.Ident(e.Role), len(e.Missing), noun)
	for _, p := range e.Missing {
		fmt.Fprintf(&b, " %s on %s (%s);", p.Privilege, p.Object, p.Why)
	}
	b.WriteString(" run as an administrator:")
	for _, g := range e.Grants() {
		b.WriteString(" " + g)
	}
	return b.String()
}

// Grants returns the statements that give the Missing privileges, in
// order: one GRANT per object naming all its missing privileges.
func (e *PrivilegeError) Grants() []string {
	var (
		out     []string
		objects []string
		privs   = map[string][]string{}
	)
	for _, p := range e.Missing {
		if p.Privilege == "OWNER" {
			if !slices.Contains(out, p.Grant) {
				out = append(out, p.Grant)
			}
			continue
		}
		obj := strings.ToUpper(p.Object[:strings.IndexByte(p.Object, ' ')]) + p.Object[strings.IndexByte(p.Object, ' '):]
		if privs[obj] == nil {
			objects = append(objects, obj)
		}
		if !slices.Contains(privs[obj], p.Privilege) {
			privs[obj] = append(privs[obj], p.Privilege)
		}
	}
	for _, obj := range objects {
		out = append(out, GrantOn(strings.Join(privs[obj], ", "), obj, e.Role))
	}
	return out
}

// Unwrap returns [backfilltype.ErrPrivilege].
func (e *PrivilegeError) Unwrap() error { return backfilltype.ErrPrivilege }

// NewPrivilegeError returns nil when missing is empty, else a
// *PrivilegeError of role.
func NewPrivilegeError(role string, missing []backfilltype.Privilege) error {
	if len(missing) == 0 {
		return nil
	}
	return &PrivilegeError{Role: role, Missing: missing}
}

// GrantOn is the GRANT statement of privs on object (its kind and quoted
// name, such as `TABLE "s"."t"`) to role.
func GrantOn(privs, object, role string) string {
	return fmt.Sprintf("GRANT %s ON %s TO %s;", privs, object, sqlgen.Ident(role))
}

// pgPrivilegeRow is one (object, privilege) the privilege queries below
// return when the role lacks it.
type pgPrivilegeRow struct {
	Kind      string `db:"kind"`   // SCHEMA, TABLE, SEQUENCE, DATABASE
	Schema    string `db:"schema"` // the schema, or the relation's schema
	Name      string `db:"name"`   // the relation or database; "" for a schema
	Privilege string `db:"privilege"`
	Why       string `db:"why"`
	Owner     string `db:"owner"` // the object's owner
	Args      string `db:"args"`  // a function's argument types; "" for others
}

// privilegeRows turns the query's rows into Privileges of role.
func privilegeRows(rows []pgPrivilegeRow, role string) []backfilltype.Privilege {
	out := make([]backfilltype.Privilege, len(rows))
	for i, r := range rows {
		var name string
		switch {
		case r.Schema == "":
			name = sqlgen.Ident(r.Name)
		case r.Name == "":
			name = sqlgen.Ident(r.Schema)
		default:
			name = sqlgen.Ident(r.Schema) + "." + sqlgen.Ident(r.Name)
		}
		if r.Kind == "FUNCTION" {
			name += "(" + r.Args + ")"
		}
		out[i] = backfilltype.Privilege{Object: strings.ToLower(r.Kind) + " " + name, Privilege: r.Privilege,
			Grant: GrantOn(r.Privilege, r.Kind+" "+name, role), Why: r.Why}
	}
	return out
}

// manifestPrivilegesSQL lists the privileges on the manifest (schema $1)
// and the database that the role $2 lacks, with each object's owner. It names objects by
// OID, so it runs without USAGE on the schema. Persistent staging tables
// (stage_<batch>, created by the runs that use them) are left out. The
// audit log (events) and schema_migrations are only read: a loader
// appends events through the function record_event and pauses on a
// signal through library_control (manifest version 23 on).
const manifestPrivilegesSQL = `
WITH ns AS (SELECT oid, nspname, nspowner FROM pg_namespace WHERE nspname = $1),
rels AS (
	SELECT c.oid, c.relkind, ns.nspname, c.relname, c.relowner
	FROM pg_class c JOIN ns ON c.relnamespace = ns.oid
	WHERE c.relkind IN ('r', 'p', 'S') AND c.relname !~ '^stage_[0-9]+$'),
want AS (
	SELECT 'SCHEMA' AS kind, nspname AS schema, '' AS name, 'USAGE' AS privilege, 'the manifest' AS why,
		has_schema_privilege($2::name, oid, 'USAGE') AS ok, 0 AS ord, pg_get_userbyid(nspowner) AS owner, '' AS args FROM ns
	UNION ALL
	SELECT 'TABLE', r.nspname, r.relname, p, 'the manifest', CASE WHEN r.relkind <> 'S' THEN has_table_privilege($2::name, r.oid, p) END, 1, pg_get_userbyid(r.relowner), ''
	FROM rels r, unnest(CASE WHEN r.relname IN ('schema_migrations', 'events') THEN ARRAY['SELECT']
		ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) WITH ORDINALITY AS x(p, i)
	WHERE r.relkind <> 'S'
	UNION ALL
	SELECT 'SEQUENCE', r.nspname, r.relname, 'USAGE', 'the manifest', CASE WHEN r.relkind = 'S' THEN has_sequence_privilege($2::name, r.oid, 'USAGE') END, 2, pg_get_userbyid(r.relowner), ''
	FROM rels r WHERE r.relkind = 'S'
		-- identity columns' sequences need no privilege of the inserting role
		AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid AND d.deptype = 'i')
	UNION ALL
	SELECT 'FUNCTION', ns.nspname, p.proname, 'EXECUTE',
		CASE p.proname WHEN 'record_event' THEN 'the audit log' ELSE 'pausing on a signal' END,
		has_function_privilege($2::name, p.oid, 'EXECUTE'), 3, pg_get_userbyid(p.proowner), oidvectortypes(p.proargtypes)
	FROM pg_proc p JOIN ns ON p.pronamespace = ns.oid WHERE p.proname IN ('record_event', 'library_control')
	UNION ALL
	SELECT 'DATABASE', '', current_database(), 'TEMPORARY', 'staging tables',
		has_database_privilege($2::name, current_database(), 'TEMPORARY'), 4,
		(SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()), '')
SELECT kind, schema, name, privilege, why, owner, args FROM want WHERE ok IS FALSE
ORDER BY ord, name, array_position(ARRAY['USAGE', 'SELECT', 'INSERT', 'UPDATE', 'DELETE', 'EXECUTE', 'TEMPORARY'], privilege)`

// operatorPrivilegesSQL lists the privileges on the manifest (schema $1)
// that the operator role $2 lacks: USAGE on the schema, SELECT on its
// tables and EXECUTE on the control functions ([ControlFunctions]).
const operatorPrivilegesSQL = `
WITH ns AS (SELECT oid, nspname, nspowner FROM pg_namespace WHERE nspname = $1),
want AS (
	SELECT 'SCHEMA' AS kind, nspname AS schema, '' AS name, 'USAGE' AS privilege, 'the manifest' AS why,
		has_schema_privilege($2::name, oid, 'USAGE') AS ok, 0 AS ord, pg_get_userbyid(nspowner) AS owner, '' AS args FROM ns
	UNION ALL
	SELECT 'TABLE', ns.nspname, c.relname, 'SELECT', 'status, events, exceptions and report', has_table_privilege($2::name, c.oid, 'SELECT'), 1, pg_get_userbyid(c.relowner), ''
	FROM pg_class c JOIN ns ON c.relnamespace = ns.oid WHERE c.relkind IN ('r', 'p') AND c.relname !~ '^stage_[0-9]+$'
	UNION ALL
	SELECT 'FUNCTION', ns.nspname, p.proname, 'EXECUTE', 'the control functions',
		has_function_privilege($2::name, p.oid, 'EXECUTE'), 2, pg_get_userbyid(p.proowner), oidvectortypes(p.proargtypes)
	FROM pg_proc p JOIN ns ON p.pronamespace = ns.oid WHERE p.proname IN ('pause', 'resume', 'cancel', 'set_knob'))
SELECT kind, schema, name, privilege, why, owner, args FROM want WHERE ok IS FALSE
ORDER BY ord, name, args`

// CheckPrivileges returns a [*PrivilegeError] (wrapping
// [backfilltype.ErrPrivilege]) listing the privileges on the manifest and
// the database that the session's role lacks to run, resume, validate and
// roll back jobs (see [Manifest.Grants]), with the GRANT statements to run;
// nil when it has them all. It runs one catalog query, needs no privilege
// itself, and does not check the manifest's version ([Manifest.Version]).
func (m *Manifest) CheckPrivileges(ctx context.Context, db sqlx.ExtContext) error {
	ctx = m.purpose(ctx, "check privileges on the manifest", 0)
	var (
		missing []backfilltype.Privilege
		role    string
	)
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		missing, role, err = m.MissingPrivileges(ctx, tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: privileges on manifest %q: %w", m.SchemaName, err)
	}
	return NewPrivilegeError(role, missing)
}

// MissingPrivileges returns the privileges on the manifest that the
// session's role lacks (USAGE on the schema; SELECT, INSERT, UPDATE and
// DELETE on its tables, SELECT only on schema_migrations; USAGE on its
// sequences; TEMPORARY on the database), each with its GRANT, in that
// order (none: nil), and the role's name (current_user). It runs in db as
// it is (callers outside a transaction use [Manifest.CheckPrivileges],
// which reads in a read-only transaction); the error is the catalog
// query's.
func (m *Manifest) MissingPrivileges(ctx context.Context, db sqlx.ExtContext) ([]backfilltype.Privilege, string, error) {
	var role string
	if err := sqlx.GetContext(ctx, db, &role, `SELECT current_user`); err != nil {
		return nil, "", err
	}
	var rows []pgPrivilegeRow
	if err := sqlx.SelectContext(ctx, db, &rows, manifestPrivilegesSQL, m.SchemaName, role); err != nil {
		return nil, "", err
	}
	return privilegeRows(rows, role), role, nil
}

// Grants returns the statements that give role, a loader (the role that
// runs jobs), every privilege on the manifest and the database it needs
// once the SchemaName is migrated ([Manifest.Migrate]): USAGE on the
// schema; SELECT, INSERT, UPDATE and DELETE on its tables but the audit
// log (events) and schema_migrations, which it only reads (a REVOKE
// takes back what the GRANT on all tables gave); EXECUTE on the functions
// record_event (the library's events) and library_control (the pause and
// cancel of [backfill.Runner.PauseOnSignal]); USAGE on its sequences;
// TEMPORARY on database. A loader does not steer runs: the control
// functions are an operator's ([Manifest.OperatorGrants]). Run them after
// each migration (ON ALL TABLES covers the tables that exist when it
// runs). The target's privileges depend on the job
// (backfill.TargetGrants). Identifiers are quoted.
func (m *Manifest) Grants(database, role string) []string {
	s, r := sqlgen.Ident(m.SchemaName), sqlgen.Ident(role)
	return []string{
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON TABLE %s.events, %s.schema_migrations FROM %s;", s, s, r),
		fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s.record_event(bigint, text, text, text, jsonb), %s.library_control(bigint, text, text) TO %s;", s, s, r),
		fmt.Sprintf("GRANT USAGE ON ALL SEQUENCES IN SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT TEMPORARY ON DATABASE %s TO %s;", sqlgen.Ident(database), r),
	}
}

// ControlFunctions are the manifest's control functions an operator role
// executes, with their argument types: pause, resume, cancel and set_knob,
// by batch id and by job name, approve by batch id, and set_module_flag
// by graph and module name.
var ControlFunctions = []string{
	"pause(bigint, text, text)", "resume(bigint, text, text)", "cancel(bigint, text, text)",
	"pause(text, text, text)", "resume(text, text, text)", "cancel(text, text, text)",
	"set_knob(bigint, text, text, text, text)", "set_knob(text, text, text, text, text)",
	"approve(bigint, text, text, text)",
	"set_module_flag(text, text, boolean, text, text)",
}

// OperatorGrants returns the GRANT statements that make role an operator
// of the migrated manifest: USAGE on the schema, SELECT on its tables (the
// read commands: status, events, exceptions, report) and EXECUTE on the
// control functions ([ControlFunctions]), which run as the manifest's
// owner. An operator writes no table directly. Identifiers are quoted.
func (m *Manifest) OperatorGrants(role string) []string {
	s, r := sqlgen.Ident(m.SchemaName), sqlgen.Ident(role)
	fns := make([]string, len(ControlFunctions))
	for i, f := range ControlFunctions {
		fns[i] = s + "." + f
	}
	return []string{
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT SELECT ON ALL TABLES IN SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT EXECUTE ON FUNCTION %s TO %s;", strings.Join(fns, ", "), r),
	}
}

// Version returns the manifest schema's version (0 when the schema or
// its schema_migrations table does not exist) and the version this
// library needs. It runs no DDL and takes no lock. A role without USAGE
// on the schema or SELECT on schema_migrations gets a [*PrivilegeError].
func (m *Manifest) Version(ctx context.Context, db sqlx.ExtContext) (current, latest int, err error) {
	ctx = m.purpose(ctx, "read the manifest's version", 0)
	// In a read transaction: safe behind a transaction pooler.
	err = ReadTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		current, latest, err = m.version(ctx, tx, ActionRun)
		return err
	})
	return current, latest, err
}

// version reads the version in db; a role that may not read it gets the
// error of [Manifest.CheckAccess] for action and fns.
func (m *Manifest) version(ctx context.Context, db sqlx.ExtContext, action Action, fns ...string) (current, latest int, err error) {
	latest = len(PgMigrations)
	var st struct {
		Table    bool `db:"has_table"`
		Readable bool `db:"readable"`
	}
	err = sqlx.GetContext(ctx, db, &st, `SELECT c.oid IS NOT NULL AS has_table,
		coalesce(has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT'), false) AS readable
		FROM (SELECT 1) x LEFT JOIN pg_namespace n ON n.nspname = $1
		LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'schema_migrations'`, m.SchemaName)
	switch {
	case err != nil:
		return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.SchemaName, err)
	case !st.Table:
		return 0, latest, nil
	case !st.Readable:
		if err := m.CheckAccess(ctx, db, action, fns...); err != nil {
			return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.SchemaName, err)
		}
	}
	if err := sqlx.GetContext(ctx, db, &current, m.SQL(`SELECT coalesce(max(version), 0) FROM {s}.schema_migrations`)); err != nil {
		return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.SchemaName, err)
	}
	return current, latest, nil
}

// Init makes sure the manifest's schema is at this library's version. When
// it is, Init only reads the version: no DDL, no lock, so a role with the
// privileges of [Manifest.Grants] can call it. When the schema is behind
// (or does not exist), Init migrates it ([Manifest.Migrate]) if the
// session's role may; when the role lacks the privilege (SQLSTATE 42501),
// it returns an error wrapping [backfilltype.ErrSchemaBehind] naming the
// SchemaName's and the library's versions ([backfilltype.ErrSchemaMissing]
// when the schema has no migration applied): an administrator must run
// "backfill migrate" once. A schema newer than the library is an error.
func (m *Manifest) Init(ctx context.Context, db sqlx.ExtContext) error {
	cur, latest, err := m.Version(ctx, db)
	if err != nil {
		return fmt.Errorf("backfill: manifest init: %w", pgurl.Hint(err))
	}
	switch {
	case cur == latest:
		return nil
	case cur > latest:
		return fmt.Errorf("backfill: manifest init: manifest schema %q is at version %d, newer than this library's %d", m.SchemaName, cur, latest)
	}
	err = m.Migrate(ctx, db)
	var pe *pq.Error
	if errors.As(err, &pe) && pe.Code == "42501" && cur == 0 { // insufficient_privilege
		return fmt.Errorf("backfill: manifest init: %w: schema %q does not exist (no migration applied), this library needs version %d, and role cannot create it (%v); "+
			"run `backfill migrate --schema %s` (or PGManifest.Migrate) once as a role that may create it",
			backfilltype.ErrSchemaMissing, m.SchemaName, latest, pe.Message, sqlgen.Ident(m.SchemaName))
	}
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("backfill: manifest init: %w: schema %q is at version %d, this library needs version %d, and role cannot migrate it (%v); "+
			"run `backfill migrate --schema %s` (or PGManifest.Migrate) once as a role that owns the schema or may create it",
			backfilltype.ErrSchemaBehind, m.SchemaName, cur, latest, pe.Message, sqlgen.Ident(m.SchemaName))
	}
	return err
}

// Migrate creates the manifest's schema if it does not exist and applies
// the migrations it lacks, in one transaction, serialised by a
// transaction-level advisory lock (pg_advisory_xact_lock, PostgreSQL docs
// 9.27.10) so concurrent callers are safe. It is the administrator's step
// ("backfill migrate"): it needs CREATE on the database (for CREATE
// SCHEMA, unless the schema exists) and ownership of the schema and its
// tables; a statement refused for a missing privilege (42501) is named in
// the error, which then also wraps a [*PrivilegeError] with the GRANT to
// run (or, for CREATE SCHEMA, says to create the schema first). The
// transaction is READ COMMITTED whatever the database's default
// isolation, so each statement after the lock sees what the caller
// before it created, and it is retried on 40001 and 40P01 (InTx). When db
// is a transaction the migration joins it, at that transaction's
// isolation level. A schema already current is left alone.
func (m *Manifest) Migrate(ctx context.Context, db sqlx.ExtContext) error {
	_, err := m.MigrateGrant(ctx, db)
	return err
}

// MigrateGrant migrates the schema as [Manifest.Migrate] does and, in the
// same transaction and under the same advisory lock, runs the statements of
// [Manifest.Grants] for each of roles, then checks that each role has every
// privilege they give (has_*_privilege). Concurrent callers are serialised
// by the lock, so concurrent GRANTs on the same object cannot fail with
// "tuple concurrently updated" (XX000), and each caller's MigrateResult
// says what it did (the version is read after the lock). A privilege a role
// still lacks (the caller holds it without grant option, so PostgreSQL only
// warned) is listed in NotGranted and the error wraps
// [backfilltype.ErrPrivilege], naming the role, the privilege, the
// statement and the object's owner who can run it; the migration and the
// effective grants are committed all the same.
func (m *Manifest) MigrateGrant(ctx context.Context, db sqlx.ExtContext, roles ...string) (backfilltype.MigrateResult, error) {
	return m.MigrateGrantRoles(ctx, db, roles, nil)
}

// MigrateGrantRoles is [Manifest.MigrateGrant] with operator roles too: in
// the same transaction, under the same lock, it creates each of operators
// that does not exist (CREATE ROLE ... NOLOGIN, which needs CREATEROLE;
// an existing role is used as it is, listed in Granted as a comment),
// runs the statements of [Manifest.OperatorGrants] for it and checks
// them as it checks the loaders' (loaders get [Manifest.Grants]). A login
// role becomes an operator by membership: GRANT operator TO person.
func (m *Manifest) MigrateGrantRoles(ctx context.Context, db sqlx.ExtContext, loaders, operators []string) (backfilltype.MigrateResult, error) {
	ctx = m.purpose(ctx, "grant roles", 0)
	var res backfilltype.MigrateResult
	err := InTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		res = backfilltype.MigrateResult{}
		if res.From, res.To, err = m.migrate(ctx, tx); err != nil || len(loaders)+len(operators) == 0 {
			return err
		}
		var database string
		if err := sqlx.GetContext(ctx, tx, &database, `SELECT current_database()`); err != nil {
			return err
		}
		// grant runs stmts for role and verifies them with the query check.
		grant := func(role string, stmts []string, check string) error {
			for _, q := range stmts {
				if _, err := tx.ExecContext(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			var rows []pgPrivilegeRow
			if err := sqlx.SelectContext(ctx, tx, &rows, check, m.SchemaName, role); err != nil {
				return fmt.Errorf("verify the grants to %s: %w", sqlgen.Ident(role), err)
			}
			missing := privilegeRows(rows, role)
			for i, p := range missing {
				res.NotGranted = append(res.NotGranted, backfilltype.RolePrivilege{Role: role, Privilege: p, Owner: rows[i].Owner})
			}
			for _, q := range stmts {
				if !slices.ContainsFunc(missing, func(p backfilltype.Privilege) bool { return grantCovers(q, p) }) {
					res.Granted = append(res.Granted, q)
				}
			}
			return nil
		}
		for _, role := range loaders {
			if err := grant(role, m.Grants(database, role), manifestPrivilegesSQL); err != nil {
				return err
			}
		}
		for _, role := range operators {
			var exists bool
			if err := sqlx.GetContext(ctx, tx, &exists, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role); err != nil {
				return err
			}
			if exists {
				res.Granted = append(res.Granted, fmt.Sprintf("-- role %s exists: made an operator as it is", sqlgen.Ident(role)))
			} else {
				q := fmt.Sprintf("CREATE ROLE %s NOLOGIN;", sqlgen.Ident(role))
				if _, err := tx.ExecContext(ctx, q); err != nil {
					var pe *pq.Error
					if errors.As(err, &pe) && pe.Code == "42501" {
						return fmt.Errorf("%s: %w: create the operator role first (as a role with CREATEROLE), or name an existing one (%w)", q, backfilltype.ErrPrivilege, err)
					}
					return fmt.Errorf("%s: %w", q, err)
				}
				res.Granted = append(res.Granted, q)
			}
			if err := grant(role, m.OperatorGrants(role), operatorPrivilegesSQL); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return backfilltype.MigrateResult{}, fmt.Errorf("backfill: manifest migrate: %w", err)
	}
	if len(res.NotGranted) > 0 {
		var b strings.Builder
		for _, p := range res.NotGranted {
			fmt.Fprintf(&b, "; role %s lacks %s on %s: run %s as its owner %s (or a superuser, or a role holding it WITH GRANT OPTION)",
				sqlgen.Ident(p.Role), p.Privilege.Privilege, p.Object, p.Grant, sqlgen.Ident(p.Owner))
		}
		return res, fmt.Errorf("backfill: manifest grant: %w: PostgreSQL granted %d of the privileges only with a warning, because this role holds them without grant option%s",
			backfilltype.ErrPrivilege, len(res.NotGranted), b.String())
	}
	return res, nil
}

// grantCovers reports whether the statement q of [Manifest.Grants]
// gives the privilege p.
func grantCovers(q string, p backfilltype.Privilege) bool {
	kind, _, _ := strings.Cut(p.Object, " ")
	switch strings.ToUpper(kind) {
	case "DATABASE":
		return strings.Contains(q, " ON DATABASE ")
	case "SCHEMA":
		return strings.Contains(q, " ON SCHEMA ")
	case "TABLE":
		return strings.Contains(q, " ON ALL TABLES ")
	case "SEQUENCE":
		return strings.Contains(q, " ON ALL SEQUENCES ")
	case "FUNCTION":
		return strings.Contains(q, " ON FUNCTION ")
	}
	return false
}

// migrate is Migrate in the transaction tx: it returns the version before
// (read under the lock) and after.
func (m *Manifest) migrate(ctx context.Context, tx sqlx.ExtContext) (from, to int, err error) {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.migrate:' || $1, 0))`, m.SchemaName); err != nil {
		return 0, 0, err
	}
	// Read under the lock: another caller may have migrated it while this
	// one waited.
	cur, latest, err := m.Version(ctx, tx)
	if err != nil {
		return 0, 0, err
	}
	if cur == latest {
		return cur, cur, nil
	}
	if cur > latest {
		return cur, cur, fmt.Errorf("manifest schema %q is at version %d, newer than this library's %d", m.SchemaName, cur, latest)
	}
	var who struct {
		Role     string `db:"role"`
		Database string `db:"database"`
		Exists   bool   `db:"exists"`
		Owner    string `db:"owner"`
	}
	if err := sqlx.GetContext(ctx, tx, &who, `SELECT current_user AS role, current_database() AS database,
		n.oid IS NOT NULL AS exists, coalesce(pg_get_userbyid(n.nspowner), '') AS owner
		FROM (SELECT 1) x LEFT JOIN pg_namespace n ON n.nspname = $1`, m.SchemaName); err != nil {
		return 0, 0, err
	}
	// The migrations are DDL on the manifest's own, small tables: they run
	// whatever the session's or the database's statement_timeout (a
	// database set to 300 ms for its application would fail them on a busy
	// server); the caller's value comes back for the rest of the
	// transaction. lock_timeout is left as it is.
	var timeout string
	if err := sqlx.GetContext(ctx, tx, &timeout, `SELECT current_setting('statement_timeout')`); err != nil {
		return 0, 0, err
	}
	if _, err := tx.ExecContext(ctx, `SELECT set_config('statement_timeout', '0', true)`); err != nil {
		return 0, 0, err
	}
	defer func() {
		if err == nil {
			_, err = tx.ExecContext(ctx, `SELECT set_config('statement_timeout', $1, true)`, timeout)
		}
	}()
	s := sqlgen.Ident(m.SchemaName)
	// denied names the statement q refused for a missing privilege.
	denied := func(q string, err error) error {
		var pe *pq.Error
		if !errors.As(err, &pe) || pe.Code != "42501" {
			return err
		}
		return fmt.Errorf("%s: %w: role %s may not run it (%w); run the migration as the owner of schema %s (%s) or a superuser",
			q, backfilltype.ErrPrivilege, sqlgen.Ident(who.Role), err, s, sqlgen.Ident(who.Owner))
	}
	if cur == 0 {
		// CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even
		// when the schema exists: a schema an administrator created for
		// the role is used as it is.
		if !who.Exists {
			if _, err := tx.ExecContext(ctx, m.SQL(`CREATE SCHEMA {s}`)); err != nil {
				var pe *pq.Error
				if !errors.As(err, &pe) || pe.Code != "42501" {
					return 0, 0, err
				}
				db := sqlgen.Ident(who.Database)
				perr := &PrivilegeError{Role: who.Role, Missing: []backfilltype.Privilege{{Object: "database " + db, Privilege: "CREATE",
					Grant: GrantOn("CREATE", "DATABASE "+db, who.Role),
					Why:   fmt.Sprintf("to run CREATE SCHEMA %s; or else an administrator creates the schema first: CREATE SCHEMA %s AUTHORIZATION %s", s, s, sqlgen.Ident(who.Role))}}}
				return 0, 0, fmt.Errorf("CREATE SCHEMA %s: %w (%w)", s, perr, err)
			}
		}
		if _, err := tx.ExecContext(ctx, m.SQL(`CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
			version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
			return 0, 0, denied("CREATE TABLE "+s+".schema_migrations", err)
		}
	}
	for v := cur + 1; v <= latest; v++ {
		if _, err := tx.ExecContext(ctx, m.SQL(PgMigrations[v-1])); err != nil {
			return 0, 0, fmt.Errorf("migration %d: %w", v, denied("its DDL", err))
		}
		if _, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.schema_migrations (version) VALUES ($1)`), v); err != nil {
			return 0, 0, denied("INSERT INTO "+s+".schema_migrations", err)
		}
	}
	return cur, latest, nil
}
