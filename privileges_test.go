package backfill_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// leastRole is a login role of its own for a test, on the test's own
// database: url connects as it. Dropped (with its privileges) when the
// test ends, before the database.
type leastRole struct {
	name, url string
	admin     *sqlx.DB // the test database, as the superuser
	db        *sqlx.DB // the test database, as the role
}

func newLeastRole(t *testing.T) *leastRole {
	t.Helper()
	adminURL := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", adminURL)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "rt_" + hex.EncodeToString(b)
	_, err := admin.Exec(`CREATE ROLE ` + name + ` LOGIN PASSWORD 'pw'`)
	require.NoError(t, err)
	u, err := neturl.Parse(adminURL)
	require.NoError(t, err)
	u.User = neturl.UserPassword(name, "pw")
	r := &leastRole{name: name, url: u.String(), admin: admin, db: sqlx.MustOpen("postgres", u.String())}
	t.Cleanup(func() {
		_ = r.db.Close()
		_, _ = admin.Exec(`DROP OWNED BY ` + name)
		_, _ = admin.Exec(`DROP ROLE ` + name)
		_ = admin.Close()
	})
	return r
}

func (r *leastRole) exec(t *testing.T, sql string) {
	t.Helper()
	_, err := r.admin.Exec(strings.ReplaceAll(sql, "{role}", r.name))
	require.NoError(t, err, sql)
}

// TestLeastPrivilegeRunResumeRollback: after an administrator's migration,
// a role with only USAGE on the manifest's schema and DML on its tables,
// TEMPORARY on the database, and SELECT and INSERT on the target runs a
// first load (Upsert, which only inserts). A replay that would update
// rows fails with ErrPrivilege and writes nothing until UPDATE is
// granted, then resumes. The rollback of the replay, which only updated
// rows, needs UPDATE but not DELETE; the rollback of the first load needs
// DELETE: each refused with the GRANT to run before anything changes,
// then done.
func TestLeastPrivilegeRunResumeRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	s := &itemsSetup{db: r.admin}
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	// The administrator's step, then the grants (no CREATE anywhere, and
	// TEMPORARY only by grant).
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, r.admin))
	r.exec(t, `REVOKE TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" FROM PUBLIC`)
	r.exec(t, `GRANT TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" TO {role}`)
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT ON items TO {role}`)

	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	// Validators run as the role too (exact: they replay and compare).
	validators := []backfill.Validator{backfill.DuplicateKeys{}, backfill.Completeness{CompareContent: true, Exact: true},
		backfill.ReplayChangesNothing{Exact: true}}
	first := s.job(1)
	first.Validators = validators
	rep, err := runner.Run(ctx, first)
	require.NoError(t, err, "first load as the role")
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	require.Contains(t, strings.Join(rep.Warnings, "\n"), "lacks UPDATE on \"public\".\"items\": the run only inserts")

	// A replay with changed rows needs UPDATE: the first chunk fails, with
	// the GRANT to run, and writes nothing.
	job := s.job(2)
	job.NewRun, job.Validators = true, validators
	rep2, err := runner.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `GRANT UPDATE ON TABLE "public"."items" TO "`+r.name+`";`)
	var changed int
	require.NoError(t, r.admin.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%' OR backfill_updated_by IS DISTINCT FROM backfill_inserted_by`))
	require.Zero(t, changed)
	r.exec(t, `GRANT UPDATE ON items TO {role}`)
	job.NewRun = false
	rep2, err = runner.Run(ctx, job)
	require.NoError(t, err, "resume after GRANT UPDATE")
	require.Equal(t, int64(1000), rep2.Counts.Read)
	require.Equal(t, int64(100), rep2.Counts.Updated)
	require.Equal(t, int64(900), rep2.Counts.Unchanged)

	// The rollback of the replay, which only updated rows, needs UPDATE
	// (it restores them) and not DELETE: refused before it changes
	// anything, naming UPDATE alone.
	r.exec(t, `REVOKE UPDATE ON items FROM {role}`)
	_, err = runner.Rollback(ctx, job, backfill.RollbackOptions{Actor: "test", Why: "test"})
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `run as an administrator: GRANT UPDATE ON TABLE "public"."items" TO "`+r.name+`";`)
	require.NotContains(t, err.Error(), "DELETE")
	require.NoError(t, r.admin.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Equal(t, 100, changed)
	r.exec(t, `GRANT UPDATE ON items TO {role}`)
	rb, err := runner.Rollback(ctx, job, backfill.RollbackOptions{Actor: "test", Why: "test"})
	require.NoError(t, err, "rollback of updates without DELETE")
	require.Equal(t, int64(100), rb.Restored)
	require.NoError(t, r.admin.Get(&changed, `SELECT count(*) FROM items WHERE name LIKE 'v2-%'`))
	require.Zero(t, changed)
	// The rollback of the first load deletes the rows it inserted: it
	// needs DELETE, refused before anything changes.
	_, err = runner.Rollback(ctx, first, backfill.RollbackOptions{Actor: "test", Why: "test", BatchID: rep.BatchID})
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `GRANT DELETE ON TABLE "public"."items" TO "`+r.name+`";`)
	require.NoError(t, r.admin.Get(&changed, `SELECT count(*) FROM items`))
	require.Equal(t, 1000, changed)
	r.exec(t, `GRANT DELETE ON items TO {role}`)
	rb, err = runner.Rollback(ctx, first, backfill.RollbackOptions{Actor: "test", Why: "test", BatchID: rep.BatchID})
	require.NoError(t, err)
	require.Equal(t, int64(1000), rb.Deleted)
	require.NoError(t, r.admin.Get(&changed, `SELECT count(*) FROM items`))
	require.Zero(t, changed)
}

func dbName(t *testing.T, db *sqlx.DB) string {
	var n string
	require.NoError(t, db.Get(&n, `SELECT current_database()`))
	return n
}

// TestPrivilegeCheckedBeforeBatch: each privilege of the minimal list,
// revoked in turn, is reported naming the object and the privilege with
// the GRANT statement to run, before any batch exists; two revoked
// together are reported together.
func TestPrivilegeCheckedBeforeBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	db := dbName(t, r.admin)
	r.exec(t, `CREATE SCHEMA app`)
	r.exec(t, `CREATE TABLE app.items (id bigint PRIMARY KEY, name text, n serial)`)
	r.exec(t, `CREATE TABLE app.scd (customer text NOT NULL, valid_from timestamptz NOT NULL, valid_to timestamptz, city text,
		PRIMARY KEY (customer, valid_from))`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, r.admin))
	r.exec(t, `REVOKE TEMPORARY ON DATABASE "`+db+`" FROM PUBLIC`)
	grantAll := func() {
		r.exec(t, `GRANT TEMPORARY ON DATABASE "`+db+`" TO {role}`)
		r.exec(t, `GRANT USAGE ON SCHEMA backfill, app TO {role}`)
		r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
		r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
		r.exec(t, `GRANT SELECT, INSERT ON app.items TO {role}`)
		r.exec(t, `GRANT USAGE ON SEQUENCE app.items_n_seq TO {role}`)
		r.exec(t, `GRANT SELECT, INSERT, UPDATE ON app.scd TO {role}`)
	}
	rows := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, c.Lo, "x")
	})
	items := backfill.Job{Name: "items", Chunker: backfill.IntRange(0, 4, 2), Extractor: rows,
		Target: backfill.Target{Table: "app.items", Key: []string{"id"}, Columns: []string{"id", "name"}}, Rollback: backfill.RollbackNone}
	versions := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, fmt.Sprint(c.Lo), time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), "x")
	})
	scd := backfill.Job{Name: "scd", Chunker: backfill.IntRange(0, 4, 2), Extractor: versions, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "app.scd", Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}}}
	atEnd := items
	atEnd.Name, atEnd.Publish = "at_end", backfill.Publish{Mode: backfill.PublishAtEnd}
	view := items
	view.Name, view.Publish, view.Rollback = "view", backfill.Publish{Mode: backfill.PublishVersionedView, View: "app.items_v"}, ""
	grant := func(privs, object string) string { return "GRANT " + privs + " ON " + object + ` TO "` + r.name + `";` }
	type miss struct{ object, privilege, grant string }
	cases := []struct {
		name   string
		revoke []string
		job    backfill.Job
		want   []miss
	}{
		{"manifest schema usage", []string{`REVOKE USAGE ON SCHEMA backfill FROM {role}`}, items,
			[]miss{{`schema "backfill"`, "USAGE", grant("USAGE", `SCHEMA "backfill"`)}}},
		{"runs update", []string{`REVOKE UPDATE ON backfill.runs FROM {role}`}, items,
			[]miss{{`table "backfill"."runs"`, "UPDATE", grant("UPDATE", `TABLE "backfill"."runs"`)}}},
		{"chunks insert", []string{`REVOKE INSERT ON backfill.chunks FROM {role}`}, items,
			[]miss{{`table "backfill"."chunks"`, "INSERT", grant("INSERT", `TABLE "backfill"."chunks"`)}}},
		{"exceptions delete", []string{`REVOKE DELETE ON backfill.exceptions FROM {role}`}, items,
			[]miss{{`table "backfill"."exceptions"`, "DELETE", grant("DELETE", `TABLE "backfill"."exceptions"`)}}},
		{"schema_migrations select", []string{`REVOKE SELECT ON backfill.schema_migrations FROM {role}`}, items,
			[]miss{{`table "backfill"."schema_migrations"`, "SELECT", grant("SELECT", `TABLE "backfill"."schema_migrations"`)}}},
		{"temporary", []string{`REVOKE TEMPORARY ON DATABASE "` + db + `" FROM {role}`}, items,
			[]miss{{`database "` + db + `"`, "TEMPORARY", grant("TEMPORARY", `DATABASE "`+db+`"`)}}},
		{"target schema usage", []string{`REVOKE USAGE ON SCHEMA app FROM {role}`}, items,
			[]miss{{`schema "app"`, "USAGE", grant("USAGE", `SCHEMA "app"`)}}},
		{"target select", []string{`REVOKE SELECT ON app.items FROM {role}`}, items,
			[]miss{{`table "app"."items"`, "SELECT", grant("SELECT", `TABLE "app"."items"`)}}},
		{"target insert", []string{`REVOKE INSERT ON app.items FROM {role}`}, items,
			[]miss{{`table "app"."items"`, "INSERT", grant("INSERT", `TABLE "app"."items"`)}}},
		{"serial sequence", []string{`REVOKE USAGE ON SEQUENCE app.items_n_seq FROM {role}`}, items,
			[]miss{{`sequence "app"."items_n_seq"`, "USAGE", grant("USAGE", `SEQUENCE "app"."items_n_seq"`)}}},
		{"history update", []string{`REVOKE UPDATE ON app.scd FROM {role}`}, scd,
			[]miss{{`table "app"."scd"`, "UPDATE", grant("UPDATE", `TABLE "app"."scd"`)}}},
		{"publish at end create", nil, atEnd,
			[]miss{{`schema "backfill"`, "CREATE", grant("CREATE", `SCHEMA "backfill"`)}}},
		{"versioned view create", nil, view,
			[]miss{{`schema "app"`, "CREATE", grant("CREATE", `SCHEMA "app"`)}}},
		{"two at once", []string{`REVOKE TEMPORARY ON DATABASE "` + db + `" FROM {role}`, `REVOKE INSERT ON app.items FROM {role}`}, items,
			[]miss{{`database "` + db + `"`, "TEMPORARY", grant("TEMPORARY", `DATABASE "`+db+`"`)},
				{`table "app"."items"`, "INSERT", grant("INSERT", `TABLE "app"."items"`)}}},
	}
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	for _, c := range cases {
		grantAll()
		for _, q := range c.revoke {
			r.exec(t, q)
		}
		_, err := runner.Run(ctx, c.job)
		var pe *backfill.PrivilegeError
		require.ErrorIs(t, err, backfill.ErrPrivilege, c.name)
		require.True(t, errors.As(err, &pe), c.name)
		var got []miss
		for _, m := range pe.Missing {
			got = append(got, miss{m.Object, m.Privilege, m.Grant})
			require.Contains(t, err.Error(), m.Grant, c.name)
		}
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, r.name, pe.Role)
		var runs int
		require.NoError(t, r.admin.Get(&runs, `SELECT count(*) FROM backfill.runs`))
		require.Zero(t, runs, "%s: a batch was created", c.name)
		// The statements it names are enough.
		for _, g := range pe.Grants() {
			_, err := r.admin.Exec(g)
			require.NoError(t, err, g)
		}
		if c.job.Publish.Mode == "" {
			_, err = runner.Run(ctx, c.job)
			require.NoError(t, err, "%s: after the GRANTs it named", c.name)
			c.job.NewRun = true // later cases start a new run of the job
		}
		r.exec(t, `SET session_replication_role = replica; DELETE FROM backfill.runs; RESET session_replication_role`) // past the audit log's append-only trigger
		r.exec(t, `REVOKE CREATE ON SCHEMA backfill, app FROM {role}`)
	}
}

// TestInitNoDDLAfterMigrate: once the schema is migrated, Init of a role
// without any CREATE privilege only reads the version; when the schema
// does not exist and the role cannot create it, Init says it is missing,
// naming the library's version and the command to run.
func TestInitNoDDLAfterMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	m := backfill.NewPGManifest("ops")
	err := m.Init(ctx, r.db)
	require.ErrorIs(t, err, backfill.ErrSchemaBehind)
	require.ErrorIs(t, err, backfill.ErrSchemaMissing)
	require.NotContains(t, err.Error(), "behind", "a schema that does not exist is missing")
	_, latest, _ := m.Version(ctx, r.admin)
	require.Contains(t, err.Error(), `"ops" does not exist (no migration applied), this library needs version `)
	require.Contains(t, err.Error(), "backfill migrate")

	require.NoError(t, m.Migrate(ctx, r.admin))
	cur, latest2, err := m.Version(ctx, r.admin)
	require.NoError(t, err)
	require.Equal(t, latest, cur)
	require.Equal(t, latest, latest2)
	// Without USAGE, Init names what to grant.
	err = m.Init(ctx, r.db)
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `GRANT USAGE ON SCHEMA "ops" TO "`+r.name+`";`)
	for _, g := range m.Grants(dbName(t, r.admin), r.name) {
		r.exec(t, g)
	}
	require.NoError(t, m.Init(ctx, r.db))
	require.NoError(t, m.CheckPrivileges(ctx, r.db))
	// A role with CREATE on one schema only (none on the database) may
	// migrate the manifest in it: the schema is not created again.
	r.exec(t, `CREATE SCHEMA own`)
	r.exec(t, `GRANT USAGE, CREATE ON SCHEMA own TO {role}`)
	own := backfill.NewPGManifest("own")
	require.NoError(t, own.Init(ctx, r.db))
	require.NoError(t, own.CheckPrivileges(ctx, r.db))
	cur, _, err = own.Version(ctx, r.db)
	require.NoError(t, err)
	require.Equal(t, latest, cur)
	// A schema one version behind: the role cannot migrate it.
	r.exec(t, `DELETE FROM ops.schema_migrations WHERE version = (SELECT max(version) FROM ops.schema_migrations)`)
	err = m.Init(ctx, r.db)
	require.ErrorIs(t, err, backfill.ErrSchemaBehind)
	require.Contains(t, err.Error(), "is at version "+strconv.Itoa(latest-1)+", this library needs version "+strconv.Itoa(latest))
}

// TestTargetGrants: the target's GRANTs per mode, quoted; UPDATE only
// where runs update rows, DELETE only for rollback.
func TestTargetGrants(t *testing.T) {
	t.Parallel()
	on := func(privs string) []string {
		return []string{`GRANT USAGE ON SCHEMA "Sales" TO "load er";`, `GRANT ` + privs + ` ON TABLE "Sales"."order lines" TO "load er";`}
	}
	table := `"Sales"."order lines"`
	cases := []struct {
		t    backfill.Target
		o    backfill.GrantOptions
		want []string
	}{
		{backfill.Target{Table: table}, backfill.GrantOptions{}, on("SELECT, INSERT, UPDATE")},
		{backfill.Target{Table: table}, backfill.GrantOptions{InsertOnly: true}, on("SELECT, INSERT")},
		{backfill.Target{Table: table, Conflict: backfill.TargetWins}, backfill.GrantOptions{Rollback: true}, on("SELECT, INSERT, DELETE")},
		{backfill.Target{Table: table, Conflict: backfill.NewerVersionWins}, backfill.GrantOptions{}, on("SELECT, INSERT, UPDATE")},
		{backfill.Target{Table: table, Mode: backfill.AppendOnly}, backfill.GrantOptions{}, on("SELECT, INSERT")},
		{backfill.Target{Table: table, Mode: backfill.Keyless}, backfill.GrantOptions{Rollback: true}, on("SELECT, INSERT, DELETE")},
		{backfill.Target{Table: table, Mode: backfill.History}, backfill.GrantOptions{InsertOnly: true, Rollback: true}, on("SELECT, INSERT, UPDATE, DELETE")},
		{backfill.Target{Table: table, Mode: backfill.AppendOnly}, backfill.GrantOptions{Publish: backfill.PublishAtEnd, ManifestSchema: "ops"},
			append(on("SELECT, INSERT"), `GRANT CREATE ON SCHEMA "ops" TO "load er";`)},
	}
	for _, c := range cases {
		got, err := backfill.TargetGrants("load er", c.t, c.o)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%+v %+v", c.t, c.o)
	}
	got, err := backfill.TargetGrants("r", backfill.Target{Table: "t"}, backfill.GrantOptions{})
	require.NoError(t, err)
	require.Equal(t, `GRANT SELECT, INSERT, UPDATE ON TABLE "public"."t" TO "r";`, got[1])
	_, err = backfill.TargetGrants("r", backfill.Target{Table: "t", Mode: "merge"}, backfill.GrantOptions{})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
}

// TestOwnerPrivilegeNeverSuggestsPrivilegedMembership: PublishVersionedView
// on an existing view the role does not own reports OWNER with a
// statement that never makes the role a member of a superuser's or
// otherwise privileged role: ALTER VIEW ... OWNER TO, unless the owner is
// a plain NOLOGIN owner role. The statement it names is enough.
func TestOwnerPrivilegeNeverSuggestsPrivilegedMembership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE SCHEMA app`)
	r.exec(t, `CREATE TABLE app.items (id bigint PRIMARY KEY, name text)`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, r.admin))
	r.exec(t, `GRANT USAGE, CREATE ON SCHEMA backfill, app TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON app.items TO {role}`)
	// Owner roles of the view: privileged ones (each its own way) and a
	// plain NOLOGIN one.
	owners := []struct {
		name, create string
		plain        bool
	}{
		{"", "", false}, // the test's superuser
		{r.name + "_cr", `CREATE ROLE {owner} NOLOGIN CREATEROLE`, false},
		{r.name + "_db", `CREATE ROLE {owner} NOLOGIN CREATEDB`, false},
		{r.name + "_rls", `CREATE ROLE {owner} NOLOGIN BYPASSRLS`, false},
		{r.name + "_login", `CREATE ROLE {owner} LOGIN`, false},
		{r.name + "_pg", `CREATE ROLE {owner} NOLOGIN; GRANT pg_read_all_data TO {owner}`, false},
		{r.name + "_up", `CREATE ROLE {owner}_s NOLOGIN SUPERUSER; CREATE ROLE {owner} NOLOGIN; GRANT {owner}_s TO {owner}`, false},
		{r.name + "_plain", `CREATE ROLE {owner} NOLOGIN`, true},
	}
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	rows := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Write(ctx, c.Lo, "x")
	})
	job := backfill.Job{Name: "view", Chunker: backfill.IntRange(0, 4, 2), Extractor: rows,
		Target:  backfill.Target{Table: "app.items", Key: []string{"id"}, Columns: []string{"id", "name"}},
		Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "app.items_v"}}
	for _, o := range owners {
		r.exec(t, `DROP VIEW IF EXISTS app.items_v`)
		r.exec(t, `CREATE VIEW app.items_v AS SELECT * FROM app.items`)
		owner := o.name
		if o.create != "" {
			sub := func(q string) string { return strings.ReplaceAll(q, "{owner}", owner) }
			r.exec(t, sub(o.create))
			t.Cleanup(func() {
				_, _ = r.admin.Exec(sub(`DROP OWNED BY {owner}; DROP ROLE {owner}`))
				_, _ = r.admin.Exec(sub(`DROP ROLE IF EXISTS {owner}_s`))
			})
			r.exec(t, `GRANT CREATE ON SCHEMA app TO `+owner)
			r.exec(t, `ALTER VIEW app.items_v OWNER TO `+owner)
		} else {
			require.NoError(t, r.admin.Get(&owner, `SELECT current_user`))
		}
		_, err := runner.Run(ctx, job)
		var pe *backfill.PrivilegeError
		require.True(t, errors.As(err, &pe), "owner %s: %v", owner, err)
		require.Len(t, pe.Missing, 1, "owner %s", owner)
		p := pe.Missing[0]
		require.Equal(t, "OWNER", p.Privilege)
		require.Equal(t, `view "app"."items_v"`, p.Object)
		want := `ALTER VIEW "app"."items_v" OWNER TO "` + r.name + `";`
		if o.plain {
			want = `GRANT "` + owner + `" TO "` + r.name + `";`
		}
		require.Equal(t, want, p.Grant, "owner %s", owner)
		require.Equal(t, []string{want}, pe.Grants())
		require.Contains(t, err.Error(), "lacks 1 privilege:")
		// The statement it names is enough, and the role gets no
		// privileged membership from it.
		r.exec(t, want)
		_, err = runner.Run(ctx, job)
		require.NoError(t, err, "owner %s, after %s", owner, want)
		var super bool
		require.NoError(t, r.db.Get(&super, `SELECT EXISTS (SELECT FROM pg_roles x WHERE pg_has_role(x.oid, 'MEMBER')
			AND (x.rolsuper OR x.rolcreaterole OR x.rolcreatedb OR x.rolbypassrls OR x.rolname LIKE 'pg\_%'))`))
		require.False(t, super, "owner %s: %s gave the role a privileged membership", owner, want)
		r.exec(t, `SET session_replication_role = replica; DELETE FROM backfill.runs; RESET session_replication_role`) // past the audit log's append-only trigger
		r.exec(t, `REVOKE "`+owner+`" FROM {role}`)
		job.NewRun = true
	}
}

// TestInsertOnlyNamesColumns: a role with UPDATE on some of the columns an
// Upsert writes but not all runs insert-only, and the warning and the
// refused chunk name the missing columns with the column-level GRANT,
// which is enough.
func TestInsertOnlyNamesColumns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	s := &itemsSetup{db: r.admin}
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Migrate(ctx, r.admin))
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT ON items TO {role}`)
	r.exec(t, `GRANT UPDATE (name, backfill_updated_by) ON items TO {role}`)
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	rep, err := runner.Run(ctx, s.job(1))
	require.NoError(t, err)
	grant := `GRANT UPDATE ("amount", "seen_at") ON TABLE "public"."items" TO "` + r.name + `";`
	require.Contains(t, strings.Join(rep.Warnings, "\n"), `lacks UPDATE on "public"."items" (columns "amount", "seen_at"): the run only inserts`)
	require.Contains(t, strings.Join(rep.Warnings, "\n"), grant)
	job := s.job(2)
	job.NewRun = true
	_, err = runner.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	require.Contains(t, err.Error(), `lacks UPDATE on "public"."items" (columns "amount", "seen_at")`)
	require.Contains(t, err.Error(), grant)
	r.exec(t, grant)
	job.NewRun = false
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "after %s", grant)
	require.Equal(t, int64(100), rep.Counts.Updated)
}

// TestLeastPrivilegeSkipUnchanged: a role with only DML on the manifest's
// tables, TEMPORARY on the database and SELECT, INSERT, UPDATE on the
// target (no ownership, no CREATE, no DELETE) loads with SkipUnchanged,
// replays skipping every chunk, and merges exactly a changed chunk: the
// fingerprints, the skip key and the skipped marker need nothing more.
func TestLeastPrivilegeSkipUnchanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, r.admin))
	r.exec(t, `REVOKE TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" FROM PUBLIC`)
	r.exec(t, `GRANT TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" TO {role}`)
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON items TO {role}`)

	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	src := newSkipSource()
	job := skipJob(src)
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err, "first load as the role")
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)

	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "unchanged replay as the role")
	require.Equal(t, 10, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)

	src.set(250, "changed", "2.50")
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err, "restatement as the role")
	require.Equal(t, 9, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 1, Unchanged: 999}, rep.Counts)
	var name string
	require.NoError(t, r.admin.Get(&name, `SELECT name FROM items WHERE id = 250`))
	require.Equal(t, "changed", name)
}

// TestMigrateIgnoresStatementTimeout: the migrations run with no
// statement_timeout whatever the caller's (an event trigger records the
// setting each DDL statement ran under), and the caller's value is in
// force again after them.
func TestMigrateIgnoresStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	defer db.Close()
	_, err := db.ExecContext(ctx, `CREATE TABLE ddl_timeouts (tag text, timeout text);
		CREATE FUNCTION record_ddl_timeout() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO ddl_timeouts VALUES (tg_tag, current_setting('statement_timeout')); END $$;
		CREATE EVENT TRIGGER record_ddl_timeout ON ddl_command_end EXECUTE FUNCTION record_ddl_timeout()`)
	require.NoError(t, err)
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `SET LOCAL statement_timeout = '10min'`)
	require.NoError(t, err)
	m := backfill.NewPGManifest("tight")
	require.NoError(t, m.Migrate(ctx, tx))
	var v string
	require.NoError(t, tx.GetContext(ctx, &v, `SELECT current_setting('statement_timeout')`))
	require.Equal(t, "10min", v)
	require.NoError(t, tx.Commit())
	var timeouts []string
	require.NoError(t, db.SelectContext(ctx, &timeouts, `SELECT DISTINCT timeout FROM ddl_timeouts`))
	require.Equal(t, []string{"0"}, timeouts, "every DDL statement of the migrations ran without a statement_timeout")
	cur, latest, err := m.Version(ctx, db)
	require.NoError(t, err)
	require.Equal(t, latest, cur)
}
