package backfill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Least privilege. An administrator creates and migrates the manifest's
// schema once ([PGManifest.Migrate], the command "backfill migrate"); the
// role that runs jobs then needs no DDL privilege for the manifest:
// [PGManifest.Init] only reads the schema's version when it is current.
// What the runtime role needs, and what [Runner.Run] checks before it
// creates or resumes a batch (the target's part is in
// backfill_privileges.go):
//
//   - USAGE on the manifest's schema; SELECT, INSERT, UPDATE and DELETE on
//     its tables (SELECT only on schema_migrations); USAGE on its
//     sequences, if any;
//   - TEMPORARY on the database (staging tables are temporary tables).

// Privilege is one privilege the session's role lacks: on which object,
// which privilege, and the GRANT statement that gives it.
type Privilege struct {
	// Object is the object's kind and quoted name, such as
	// `table "backfill"."runs"` or `database "app"`.
	Object string
	// Privilege is the privilege's name as GRANT spells it: SELECT,
	// INSERT, UPDATE, DELETE, USAGE, CREATE, TEMPORARY, or OWNER for
	// what only the object's owner (or a member of its role) may do.
	Privilege string
	// Grant is the statement an administrator runs to give it, with
	// every identifier quoted. For OWNER it is "ALTER TABLE|VIEW ...
	// OWNER TO role;", or the GRANT of the owner's role to the session's
	// role only when the owner is a plain NOLOGIN role without SUPERUSER,
	// CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS or pg_* memberships
	// (never membership in a superuser or otherwise privileged role).
	Grant string
	// Why says what needs it.
	Why string
}

// PrivilegeError lists every privilege the session's role lacks for a
// job, with the statements to grant them. It wraps [ErrPrivilege].
type PrivilegeError struct {
	// Role is the session's role (current_user).
	Role string
	// Missing lists the missing privileges, in a stable order.
	Missing []Privilege
}

// Error names the role, each missing privilege with its object and what
// needs it, and the GRANT statements to run.
func (e *PrivilegeError) Error() string {
	var b strings.Builder
	noun := "privileges"
	if len(e.Missing) == 1 {
		noun = "privilege"
	}
	fmt.Fprintf(&b, "%v: role %s lacks %d %s:", ErrPrivilege, sqlgen.Ident(e.Role), len(e.Missing), noun)
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
		out = append(out, grantOn(strings.Join(privs[obj], ", "), obj, e.Role))
	}
	return out
}

// Unwrap returns [ErrPrivilege].
func (e *PrivilegeError) Unwrap() error { return ErrPrivilege }

// privilegeError returns nil when missing is empty, else a
// *PrivilegeError of role.
func privilegeError(role string, missing []Privilege) error {
	if len(missing) == 0 {
		return nil
	}
	return &PrivilegeError{Role: role, Missing: missing}
}

// grantOn is the GRANT statement of privs on object (its kind and quoted
// name, such as `TABLE "s"."t"`) to role.
func grantOn(privs, object, role string) string {
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
}

// privilegeRows turns the query's rows into Privileges of role.
func privilegeRows(rows []pgPrivilegeRow, role string) []Privilege {
	out := make([]Privilege, len(rows))
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
		out[i] = Privilege{Object: strings.ToLower(r.Kind) + " " + name, Privilege: r.Privilege,
			Grant: grantOn(r.Privilege, r.Kind+" "+name, role), Why: r.Why}
	}
	return out
}

// manifestPrivilegesSQL lists the privileges on the manifest (schema $1)
// and the database that the session's role lacks. It names objects by
// OID, so it runs without USAGE on the schema. Persistent staging tables
// (stage_<batch>, created by the runs that use them) are left out.
const manifestPrivilegesSQL = `
WITH ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = $1),
rels AS (
	SELECT c.oid, c.relkind, ns.nspname, c.relname
	FROM pg_class c JOIN ns ON c.relnamespace = ns.oid
	WHERE c.relkind IN ('r', 'p', 'S') AND c.relname !~ '^stage_[0-9]+$'),
want AS (
	SELECT 'SCHEMA' AS kind, nspname AS schema, '' AS name, 'USAGE' AS privilege, 'the manifest' AS why,
		has_schema_privilege(oid, 'USAGE') AS ok, 0 AS ord FROM ns
	UNION ALL
	SELECT 'TABLE', r.nspname, r.relname, p, 'the manifest', CASE WHEN r.relkind <> 'S' THEN has_table_privilege(r.oid, p) END, 1
	FROM rels r, unnest(CASE WHEN r.relname = 'schema_migrations' THEN ARRAY['SELECT']
		ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) WITH ORDINALITY AS x(p, i)
	WHERE r.relkind <> 'S'
	UNION ALL
	SELECT 'SEQUENCE', r.nspname, r.relname, 'USAGE', 'the manifest', CASE WHEN r.relkind = 'S' THEN has_sequence_privilege(r.oid, 'USAGE') END, 2
	FROM rels r WHERE r.relkind = 'S'
		-- identity columns' sequences need no privilege of the inserting role
		AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid AND d.deptype = 'i')
	UNION ALL
	SELECT 'DATABASE', '', current_database(), 'TEMPORARY', 'staging tables',
		has_database_privilege(current_database(), 'TEMPORARY'), 3)
SELECT kind, schema, name, privilege, why FROM want WHERE ok IS FALSE
ORDER BY ord, name, array_position(ARRAY['USAGE', 'SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TEMPORARY'], privilege)`

// CheckPrivileges returns a [*PrivilegeError] (wrapping [ErrPrivilege])
// listing the privileges on the manifest and the database that the
// session's role lacks to run, resume, validate and roll back jobs (see
// [PGManifest.Grants]), with the GRANT statements to run; nil when it has
// them all. It runs one catalog query, needs no privilege itself, and
// does not check the manifest's version ([PGManifest.Version]).
func (m *PGManifest) CheckPrivileges(ctx context.Context, db sqlx.ExtContext) error {
	var (
		missing []Privilege
		role    string
	)
	err := readTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		missing, role, err = m.missingPrivileges(ctx, tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: privileges on manifest %q: %w", m.schema, err)
	}
	return privilegeError(role, missing)
}

func (m *PGManifest) missingPrivileges(ctx context.Context, db sqlx.ExtContext) ([]Privilege, string, error) {
	var role string
	if err := sqlx.GetContext(ctx, db, &role, `SELECT current_user`); err != nil {
		return nil, "", err
	}
	var rows []pgPrivilegeRow
	if err := sqlx.SelectContext(ctx, db, &rows, manifestPrivilegesSQL, m.schema); err != nil {
		return nil, "", err
	}
	return privilegeRows(rows, role), role, nil
}

// Grants returns the GRANT statements that give role every privilege on
// the manifest and the database that a role running jobs needs once the
// schema is migrated ([PGManifest.Migrate]): USAGE on the schema; SELECT,
// INSERT, UPDATE and DELETE on its tables; USAGE on its sequences;
// TEMPORARY on database. Run them after each migration (ON ALL TABLES
// covers the tables that exist when it runs). The target's privileges
// depend on the job ([TargetGrants]). Identifiers are quoted.
func (m *PGManifest) Grants(database, role string) []string {
	s, r := sqlgen.Ident(m.schema), sqlgen.Ident(role)
	return []string{
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT USAGE ON ALL SEQUENCES IN SCHEMA %s TO %s;", s, r),
		fmt.Sprintf("GRANT TEMPORARY ON DATABASE %s TO %s;", sqlgen.Ident(database), r),
	}
}

// Version returns the manifest schema's version (0 when the schema or
// its schema_migrations table does not exist) and the version this
// library needs. It runs no DDL and takes no lock. A role without USAGE
// on the schema or SELECT on schema_migrations gets a [*PrivilegeError].
func (m *PGManifest) Version(ctx context.Context, db sqlx.ExtContext) (current, latest int, err error) {
	// In a read transaction: safe behind a transaction pooler.
	err = readTx(ctx, db, func(tx sqlx.ExtContext) (err error) {
		current, latest, err = m.version(ctx, tx)
		return err
	})
	return current, latest, err
}

func (m *PGManifest) version(ctx context.Context, db sqlx.ExtContext) (current, latest int, err error) {
	latest = len(pgMigrations)
	var st struct {
		Table    bool `db:"has_table"`
		Readable bool `db:"readable"`
	}
	err = sqlx.GetContext(ctx, db, &st, `SELECT c.oid IS NOT NULL AS has_table,
		coalesce(has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT'), false) AS readable
		FROM (SELECT 1) x LEFT JOIN pg_namespace n ON n.nspname = $1
		LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'schema_migrations'`, m.schema)
	switch {
	case err != nil:
		return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.schema, err)
	case !st.Table:
		return 0, latest, nil
	case !st.Readable:
		if err := m.CheckPrivileges(ctx, db); err != nil {
			return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.schema, err)
		}
	}
	if err := sqlx.GetContext(ctx, db, &current, m.sql(`SELECT coalesce(max(version), 0) FROM {s}.schema_migrations`)); err != nil {
		return 0, latest, fmt.Errorf("backfill: manifest %q version: %w", m.schema, err)
	}
	return current, latest, nil
}

// Init makes sure the manifest's schema is at this library's version.
// When it is, Init only reads the version: no DDL, no lock, so a role
// with the privileges of [PGManifest.Grants] can call it. When the schema
// is behind (or does not exist), Init migrates it ([PGManifest.Migrate])
// if the session's role may; when the role lacks the privilege (SQLSTATE
// 42501), it returns an error wrapping [ErrSchemaBehind] naming the
// schema's and the library's versions: an administrator must run
// "backfill migrate" once. A schema newer than the library is an error.
func (m *PGManifest) Init(ctx context.Context, db sqlx.ExtContext) error {
	cur, latest, err := m.Version(ctx, db)
	if err != nil {
		return fmt.Errorf("backfill: manifest init: %w", err)
	}
	switch {
	case cur == latest:
		return nil
	case cur > latest:
		return fmt.Errorf("backfill: manifest init: manifest schema %q is at version %d, newer than this library's %d", m.schema, cur, latest)
	}
	err = m.Migrate(ctx, db)
	var pe *pq.Error
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("backfill: manifest init: %w: schema %q is at version %d, this library needs version %d, and role cannot migrate it (%v); "+
			"run `backfill migrate --schema %s` (or PGManifest.Migrate) once as a role that owns the schema or may create it",
			ErrSchemaBehind, m.schema, cur, latest, pe.Message, sqlgen.Ident(m.schema))
	}
	return err
}

// Migrate creates the manifest's schema if it does not exist and applies
// the migrations it lacks, in one transaction, serialised by a
// transaction-level advisory lock (pg_advisory_xact_lock, PostgreSQL docs
// 9.27.10) so concurrent callers are safe. It is the administrator's step
// ("backfill migrate"): it needs CREATE on the database (for CREATE
// SCHEMA, unless the schema exists) and ownership of the schema and its
// tables. The transaction is READ COMMITTED whatever the database's
// default isolation, so each statement after the lock sees what the
// caller before it created, and it is retried on 40001 and 40P01 (inTx).
// When db is a transaction the migration joins it, at that transaction's
// isolation level. A schema already current is left alone.
func (m *PGManifest) Migrate(ctx context.Context, db sqlx.ExtContext) error {
	err := inTx(ctx, db, func(tx sqlx.ExtContext) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.migrate:' || $1, 0))`, m.schema); err != nil {
			return err
		}
		// Already current (another caller migrated it while this one
		// waited for the lock): nothing to create.
		cur, latest, err := m.Version(ctx, tx)
		if err != nil {
			return err
		}
		if cur == latest {
			return nil
		}
		if cur == 0 {
			// CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even
			// when the schema exists: a schema an administrator created
			// for the role is used as it is.
			var exists bool
			if err := sqlx.GetContext(ctx, tx, &exists, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, m.schema); err != nil {
				return err
			}
			if !exists {
				if _, err := tx.ExecContext(ctx, m.sql(`CREATE SCHEMA {s}`)); err != nil {
					return err
				}
			}
			if _, err := tx.ExecContext(ctx, m.sql(`CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
			version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)); err != nil {
				return err
			}
		}
		if cur > latest {
			return fmt.Errorf("manifest schema %q is at version %d, newer than this library's %d", m.schema, cur, latest)
		}
		for v := cur + 1; v <= latest; v++ {
			if _, err := tx.ExecContext(ctx, m.sql(pgMigrations[v-1])); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			if _, err := tx.ExecContext(ctx, m.sql(`INSERT INTO {s}.schema_migrations (version) VALUES ($1)`), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("backfill: manifest migrate: %w", err)
	}
	return nil
}
