package pgstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PrivilegeChecker gathers the privileges the session's role lacks on a
// target, one catalog query per check, for one [*PrivilegeError] listing
// them all. The root package decides what a job or a rollback needs and
// calls its checks; the checks only read the catalog (has_*_privilege,
// pg_has_role), so a role lacking everything can run them. A checker is
// used in one read transaction and by one goroutine.
type PrivilegeChecker struct {
	db sqlx.ExtContext
	// Role is the session's role (current_user), to which the GRANT
	// statements of Missing give the privileges.
	Role string
	// Missing lists the privileges found lacking so far, in the order of
	// the checks. A caller may add privileges found by other checks (the
	// manifest's, [Manifest.MissingPrivileges]) in the order the error
	// should list them.
	Missing []backfilltype.Privilege
}

// NewPrivilegeChecker returns a checker running its queries on db (a read
// transaction, so that the checks are safe behind a transaction pooler),
// with Role read from current_user. It returns the query's error.
func NewPrivilegeChecker(ctx context.Context, db sqlx.ExtContext) (*PrivilegeChecker, error) {
	c := &PrivilegeChecker{db: db}
	if err := sqlx.GetContext(ctx, db, &c.Role, `SELECT current_user`); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *PrivilegeChecker) add(object, privilege, grant, why string) {
	c.Missing = append(c.Missing, backfilltype.Privilege{Object: object, Privilege: privilege, Grant: grant, Why: why})
}

// Err returns a [*PrivilegeError] of Role listing Missing, or nil when
// Missing is empty.
func (c *PrivilegeChecker) Err() error { return NewPrivilegeError(c.Role, c.Missing) }

// SchemaOf returns the schema a relation name (in the form of
// backfill.Target.Table) is in or would be created in: its qualifier, or
// the schema it resolves to on the search path, or current_schema(); ""
// when there is none on the search path. It needs no privilege on the
// schema. It returns the query's error.
func SchemaOf(ctx context.Context, db sqlx.ExtContext, name string) (string, error) {
	var s string
	err := sqlx.GetContext(ctx, db, &s, `SELECT CASE WHEN cardinality(p) > 1 THEN p[cardinality(p) - 1]
		ELSE coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass(quote_ident(p[1]))), current_schema(), '') END
		FROM parse_ident($1) AS p`, sqlgen.Table(name))
	return s, err
}

// Schema checks privilege (USAGE or CREATE) on schema and adds it to
// Missing, with why, when the role lacks it. An empty schema (none on the
// search path) or a schema that does not exist is not checked: preparing
// the target reports the table as not found. It returns the query's
// error.
func (c *PrivilegeChecker) Schema(ctx context.Context, schema, privilege, why string) error {
	if schema == "" {
		return nil // no schema on the search path: Prepare says the table is not found
	}
	var ok []bool
	if err := sqlx.SelectContext(ctx, c.db, &ok, `SELECT has_schema_privilege(oid, $2) FROM pg_namespace WHERE nspname = $1`, schema, privilege); err != nil {
		return err
	}
	if len(ok) == 1 && !ok[0] {
		q := sqlgen.Ident(schema)
		c.add("schema "+q, privilege, GrantOn(privilege, "SCHEMA "+q, c.Role), why)
	}
	return nil
}

// Columns checks privilege on the columns cols of the relation oid (every
// column when cols is empty): a table-level grant or column-level grants
// on all of them. When the role lacks it, it adds the table-level
// privilege on table (its name in the form of backfill.Target.Table) to
// Missing, with why. It returns the query's error.
func (c *PrivilegeChecker) Columns(ctx context.Context, oid int64, table, privilege string, cols []string, why string) error {
	var ok bool
	err := sqlx.GetContext(ctx, c.db, &ok, `SELECT coalesce(bool_and(has_column_privilege($1::oid, a.attnum, $2)), true)
		FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
			AND (coalesce(cardinality($3::text[]), 0) = 0 OR a.attname = ANY ($3::text[]))`, oid, privilege, pq.Array(cols))
	if err != nil {
		return err
	}
	if !ok {
		q := sqlgen.Table(table)
		c.add("table "+q, privilege, GrantOn(privilege, "TABLE "+q, c.Role), why)
	}
	return nil
}

// Table checks a table-level privilege (DELETE) on the relation oid, named
// table, and adds it to Missing, with why, when the role lacks it. It
// returns the query's error.
func (c *PrivilegeChecker) Table(ctx context.Context, oid int64, table, privilege, why string) error {
	var ok bool
	if err := sqlx.GetContext(ctx, c.db, &ok, `SELECT has_table_privilege($1::oid, $2)`, oid, privilege); err != nil {
		return err
	}
	if !ok {
		q := sqlgen.Table(table)
		c.add("table "+q, privilege, GrantOn(privilege, "TABLE "+q, c.Role), why)
	}
	return nil
}

// Owner checks that the role owns the relation oid (or is a member of its
// owner's role), as ALTER TABLE and CREATE OR REPLACE VIEW require. When
// it does not, it adds an OWNER privilege on kind ("table" or "view") name
// to Missing, with why, whose statement is never membership in a highly
// privileged role (see ownerGrant). It returns the query's error.
func (c *PrivilegeChecker) Owner(ctx context.Context, oid int64, kind, name, why string) error {
	var own struct {
		OK    bool   `db:"ok"`
		Owner string `db:"owner"`
		Plain bool   `db:"plain"`
	}
	if err := sqlx.GetContext(ctx, c.db, &own, `SELECT pg_has_role(c.relowner, 'USAGE') AS ok, r.rolname AS owner,
		`+plainOwnerRoleSQL+` AS plain
		FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE c.oid = $1::oid`, oid); err != nil {
		return err
	}
	if !own.OK {
		c.add(kind+" "+sqlgen.Table(name), "OWNER", ownerGrant(kind, sqlgen.Table(name), own.Owner, c.Role, own.Plain), why)
	}
	return nil
}

// plainOwnerRoleSQL is true when the role r (of pg_roles, the owner of a
// relation) is a plain owner role: it cannot log in, has none of
// SUPERUSER, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS, is not a
// predefined role (pg_*), and is not a member, directly or through other
// roles, of any role that has one of these or is predefined. Membership
// in such a role gives its owner's rights on what it owns, and nothing
// more.
const plainOwnerRoleSQL = `(NOT r.rolcanlogin AND NOT EXISTS (
		WITH RECURSIVE up(oid) AS (SELECT r.oid UNION SELECT m.roleid FROM pg_auth_members m JOIN up ON m.member = up.oid)
		SELECT FROM up JOIN pg_roles x ON x.oid = up.oid
		WHERE x.rolsuper OR x.rolcreaterole OR x.rolcreatedb OR x.rolreplication OR x.rolbypassrls OR x.rolname LIKE 'pg\_%'))`

// ownerGrant is the statement an administrator runs so that role may do
// what only the owner of the relation object (kind "table" or "view",
// quoted name) may do. Membership in the owner's role ("GRANT owner TO
// role") is suggested only when the owner is a plain owner role
// (plainOwnerRoleSQL): membership in any other role could give role far
// more than the ownership of one relation (a superuser's rights, CREATEROLE,
// BYPASSRLS, a pg_* role's, or logging in as a person's role's objects).
// Otherwise the statement transfers the ownership:
// "ALTER TABLE object OWNER TO role;", which an administrator (a superuser,
// or a member of both the old and the new owner's roles) runs and which
// needs role to have CREATE on the relation's schema.
func ownerGrant(kind, object, owner, role string, plain bool) string {
	if plain {
		return fmt.Sprintf("GRANT %s TO %s;", sqlgen.Ident(owner), sqlgen.Ident(role))
	}
	return fmt.Sprintf("ALTER %s %s OWNER TO %s;", strings.ToUpper(kind), object, sqlgen.Ident(role))
}

// Serials checks USAGE on the sequences of the serial columns of the
// relation oid that the merge does not write (those not in written:
// their default calls nextval), and adds each one the role lacks to
// Missing, in the order of schema and sequence name. It returns the
// query's error (after adding the rows it read).
func (c *PrivilegeChecker) Serials(ctx context.Context, oid int64, written []string) error {
	var rows []struct {
		Schema string `db:"nspname"`
		Name   string `db:"relname"`
	}
	err := sqlx.SelectContext(ctx, c.db, &rows, `SELECT n.nspname, s.relname
		FROM pg_depend d
		JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
		JOIN pg_namespace n ON n.oid = s.relnamespace
		JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
		WHERE d.classid = 'pg_class'::regclass AND d.refobjid = $1::oid AND d.deptype = 'a'
			AND NOT a.attname = ANY ($2::text[])
			AND CASE WHEN s.relkind = 'S' THEN NOT has_sequence_privilege(s.oid, 'USAGE') END
		ORDER BY 1, 2`, oid, pq.Array(written))
	for _, r := range rows {
		s := sqlgen.Ident(r.Schema) + "." + sqlgen.Ident(r.Name)
		c.add("sequence "+s, "USAGE", GrantOn("USAGE", "SEQUENCE "+s, c.Role), "defaults of serial columns")
	}
	return err
}

// RelationOID returns the oid of table (in the form of
// backfill.Target.Table), 0 when it does not exist. It returns the
// query's error.
func RelationOID(ctx context.Context, db sqlx.ExtContext, table string) (int64, error) {
	var oid []int64
	err := sqlx.SelectContext(ctx, db, &oid, `SELECT oid::bigint FROM pg_class WHERE oid = to_regclass($1)`, sqlgen.Table(table))
	if err != nil || len(oid) == 0 {
		return 0, err
	}
	return oid[0], nil
}
