package backfill_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/stretchr/testify/require"
)

// rolesRun is a test database with a migrated manifest, a loader role
// granted with PGManifest.Grants, and a run of job "items" set back to
// running (batch).
func rolesRun(t *testing.T) (r *leastRole, batch int64) {
	t.Helper()
	ctx := context.Background()
	r = newLeastRole(t)
	s := &itemsSetup{db: r.admin}
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	m := backfill.NewPGManifest("")
	require.NoError(t, m.Init(ctx, r.admin))
	for _, g := range m.Grants(dbName(t, r.admin), r.name) {
		r.exec(t, g)
	}
	r.exec(t, `GRANT SELECT, INSERT ON items TO {role}`)
	runner, err := backfill.New(r.admin, nil)
	require.NoError(t, err)
	rep, err := runner.Run(ctx, s.job(1))
	require.NoError(t, err)
	r.exec(t, `UPDATE backfill.runs SET status = 'running', finished_at = NULL`)
	return r, rep.BatchID
}

// controlEvents counts the events the control functions record.
func controlEvents(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.events WHERE kind IN ('run_paused', 'run_resumed_by_operator', 'run_cancelled', 'knob_set')`))
	return n
}

// TestControlTextCaps: the control functions refuse an actor, reason, job
// name, knob name or value over its cap, from SQL and from Go, with an
// error naming the argument, its length and the cap, and record nothing.
func TestControlTextCaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, batch := rolesRun(t)
	const fiftyMiB = 50 << 20
	for _, c := range []struct{ q, want string }{
		{`SELECT backfill.pause($1::bigint, 'ann', repeat('x', 52428800))`, "the reason is 52428800 characters long; at most 2000 are accepted"},
		{`SELECT backfill.cancel($1::bigint, repeat('é', 201), 'why')`, "the actor is 201 characters long; at most 200 are accepted"},
		{`SELECT backfill.pause(repeat('j', 1001) || $1::text, 'ann', 'why')`, "the job name is 1001 characters long; at most 1000 are accepted"},
		{`SELECT backfill.set_knob($1::bigint, repeat('k', 201), '1', 'ann', 'why')`, "the knob name is 201 characters long; at most 200 are accepted"},
		{`SELECT backfill.set_knob($1::bigint, 'concurrency', repeat('1', 101), 'ann', 'why')`, "the knob value is 101 characters long; at most 100 are accepted"},
		{`SELECT backfill.set_knob($1::bigint, 'concurrency', '2', 'ann', repeat('x', 2001))`, "the reason is 2001 characters long; at most 2000 are accepted"},
	} {
		arg := any(batch)
		if strings.Contains(c.q, "$1::text") {
			arg = ""
		}
		_, err := r.admin.Exec(c.q, arg)
		require.ErrorContains(t, err, c.want, c.q)
		var pe *pq.Error
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "22023", string(pe.Code))
		require.Less(t, len(pe.Message), 400, "the message does not repeat the text")
	}
	// The caps the functions allow pass.
	_, err := r.admin.Exec(`SELECT backfill.set_knob($1::bigint, 'concurrency', '2', repeat('a', 200), repeat('x', 2000))`, batch)
	require.NoError(t, err)

	runner, err := backfill.New(r.admin, nil)
	require.NoError(t, err)
	before := controlEvents(t, r.admin)
	big := strings.Repeat("x", fiftyMiB)
	err = runner.Pause(ctx, batch, "ann", big)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "the reason is 52428800 characters long; at most 2000 are accepted")
	require.Less(t, len(err.Error()), 400)
	err = runner.Cancel(ctx, batch, strings.Repeat("a", 201), "why")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "the actor is 201 characters long; at most 200 are accepted")
	err = runner.SetKnob(ctx, batch, "concurrency", big, "ann", "why")
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	require.ErrorContains(t, err, "the knob value is 52428800 characters long; at most 100 are accepted")
	require.Less(t, len(err.Error()), 400)
	require.Equal(t, before, controlEvents(t, r.admin), "nothing recorded")
	var st string
	require.NoError(t, r.admin.Get(&st, `SELECT status FROM backfill.runs WHERE batch_id = $1`, batch))
	require.Equal(t, "running", st)
}

// TestLoaderCannotSteerOrForge: a loader (PGManifest.Grants) gets an error
// naming its role, the EXECUTE privilege on the control function and the
// --grant-operator fix from Runner.Pause, Cancel and SetKnob; cannot write
// the audit log or schema_migrations; records the library's events and
// its signal pause through the library's functions, with its database
// role beside the actor.
func TestLoaderCannotSteerOrForge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, batch := rolesRun(t)
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	for _, c := range []struct {
		fn string
		do func() error
	}{
		{"pause(bigint, text, text)", func() error { return runner.Pause(ctx, batch, "alice", "why") }},
		{"cancel(bigint, text, text)", func() error { return runner.Cancel(ctx, batch, "alice", "why") }},
		{"set_knob(bigint, text, text, text, text)", func() error { return runner.SetKnob(ctx, batch, "concurrency", "1", "alice", "why") }},
		{"set_module_flag(text, text, boolean, text, text)", func() error { return runner.SetModuleEnabled(ctx, "items", "m", true, "alice", "why") }},
	} {
		err := c.do()
		require.ErrorIs(t, err, backfill.ErrPrivilege, c.fn)
		for _, w := range []string{`role "` + r.name + `" lacks EXECUTE on function "backfill".` + c.fn, "--grant-operator", `GRANT OPERATOR TO "` + r.name + `"`} {
			require.ErrorContains(t, err, w)
		}
	}
	for _, q := range []string{
		`INSERT INTO backfill.events (batch_id, job_name, kind, actor) VALUES ($1, 'items', 'run_paused', 'alice')`,
		`DELETE FROM backfill.schema_migrations WHERE $1::bigint > 0`,
	} {
		_, err := r.db.Exec(q, batch)
		var pe *pq.Error
		require.ErrorAs(t, err, &pe, q)
		require.Equal(t, "42501", string(pe.Code), q)
	}
	_, err = r.db.Exec(`SELECT backfill.record_event($1, 'items', 'knob_set', 'alice', '{}')`, batch)
	require.ErrorContains(t, err, "recorded only by the control functions")
	_, err = r.db.Exec(`SELECT backfill.record_event($1, 'items', 'module_flag_set', 'alice', '{"module": "m", "new": true}')`, batch)
	require.ErrorContains(t, err, "recorded only by the control functions", "a loader cannot forge a module's flag")
	require.Equal(t, 0, controlEvents(t, r.admin))

	// The library's own pause, as the loader: actor "backfill", the role.
	_, err = r.db.Exec(`SELECT backfill.library_control($1, 'pause', 'SIGTERM received by pid 1')`, batch)
	require.NoError(t, err)
	_, err = r.db.Exec(`SELECT backfill.library_control($1, 'resume', 'no')`, batch)
	require.ErrorContains(t, err, "an operator resumes")
	var ev struct {
		Actor  string `db:"actor"`
		DBRole string `db:"db_role"`
	}
	require.NoError(t, r.admin.Get(&ev, `SELECT actor, db_role FROM backfill.events WHERE kind = 'run_paused'`))
	require.Equal(t, "backfill", ev.Actor)
	require.Equal(t, r.name, ev.DBRole)
	// The run's events recorded as the loader carry its role.
	var roles []string
	require.NoError(t, r.admin.Select(&roles, `SELECT DISTINCT db_role FROM backfill.events WHERE batch_id = $1 ORDER BY 1`, batch))
	require.Contains(t, roles, r.name)
	require.NoError(t, backfill.NewPGManifest("").CheckPrivileges(ctx, r.db))
}

// TestMigrateRolesFromVersion22: a manifest at version 22 whose loader was
// granted DML on every table (the grants of that version) ends, once
// migrated, as a fresh install granted with PGManifest.Grants: no INSERT,
// UPDATE or DELETE on events and schema_migrations, EXECUTE on the
// library's functions, none on the control functions, and the privilege
// check passes.
func TestMigrateRolesFromVersion22(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	m := backfill.NewPGManifest("")
	r.exec(t, `CREATE SCHEMA backfill`)
	r.exec(t, `CREATE TABLE backfill.schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	for v := 1; v <= 22; v++ {
		r.exec(t, m.SQL(pgstore.PgMigrations[v-1]))
		_, err := r.admin.Exec(`INSERT INTO backfill.schema_migrations (version) VALUES ($1)`, v)
		require.NoError(t, err)
	}
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT USAGE ON ALL SEQUENCES IN SCHEMA backfill TO {role}`)
	require.NoError(t, m.Migrate(ctx, r.admin))
	type privileges struct {
		EventsWrite bool `db:"events_write"`
		MigWrite    bool `db:"mig_write"`
		Record      bool `db:"record"`
		Library     bool `db:"library"`
		Pause       bool `db:"pause"`
		KnobsWrite  bool `db:"knobs_write"`
	}
	var p privileges
	require.NoError(t, r.admin.Get(&p, `SELECT
		has_table_privilege($1, 'backfill.events', 'INSERT') OR has_table_privilege($1, 'backfill.events', 'UPDATE') OR has_table_privilege($1, 'backfill.events', 'DELETE') AS events_write,
		has_table_privilege($1, 'backfill.schema_migrations', 'INSERT') OR has_table_privilege($1, 'backfill.schema_migrations', 'DELETE') AS mig_write,
		has_function_privilege($1, 'backfill.record_event(bigint, text, text, text, jsonb)', 'EXECUTE') AS record,
		has_function_privilege($1, 'backfill.library_control(bigint, text, text)', 'EXECUTE') AS library,
		has_function_privilege($1, 'backfill.pause(bigint, text, text)', 'EXECUTE') AS pause,
		has_table_privilege($1, 'backfill.knobs', 'INSERT') AS knobs_write`, r.name))
	require.Equal(t, privileges{Record: true, Library: true, KnobsWrite: true}, p)
	r.exec(t, `GRANT TEMPORARY ON DATABASE "`+dbName(t, r.admin)+`" TO {role}`)
	require.NoError(t, m.CheckPrivileges(ctx, r.db))
}

// TestStatusRefusalNamesReadPrivileges: Runner.Status and StatusOf as a
// role with no grant return a *PrivilegeError of ActionRead naming USAGE
// on the schema and SELECT on its tables and the operator fix, none of a
// loader's privileges; Runner.Pause names USAGE and EXECUTE on the
// function and the same fix; once the role is an operator, nothing is
// missing.
func TestStatusRefusalNamesReadPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	m := backfill.NewPGManifest("")
	require.NoError(t, m.Init(ctx, r.admin))
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	_, err1 := runner.Status(ctx, backfill.Job{Name: "items"})
	_, err2 := runner.StatusOf(ctx, 1)
	for _, err := range []error{err1, err2} {
		require.ErrorIs(t, err, backfill.ErrPrivilege)
		var pe *backfill.PrivilegeError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, backfill.ActionRead, pe.Action)
		for _, p := range pe.Missing {
			require.Contains(t, []string{"USAGE", "SELECT"}, p.Privilege, "%v", p)
		}
		for _, w := range []string{`role "` + r.name + `" lacks USAGE on schema "backfill", SELECT on tables "backfill".`, "--grant-operator", `GRANT OPERATOR TO "` + r.name + `"`} {
			require.ErrorContains(t, err, w)
		}
		for _, w := range []string{"INSERT", "UPDATE", "DELETE", "TEMPORARY", "EXECUTE"} {
			require.NotContains(t, err.Error(), w)
		}
	}
	// Runner.Pause: USAGE and EXECUTE on the function, the operator fix.
	err = runner.Pause(ctx, 1, "alice", "why")
	require.ErrorIs(t, err, backfill.ErrPrivilege)
	for _, w := range []string{`role "` + r.name + `" lacks USAGE on schema "backfill" (and EXECUTE on function "backfill".pause(bigint, text, text))`, "--grant-operator"} {
		require.ErrorContains(t, err, w)
	}
	for _, g := range m.OperatorGrants(r.name) {
		r.exec(t, g)
	}
	require.NoError(t, m.CheckAccess(ctx, r.db, backfill.ActionRead))
	require.NoError(t, m.CheckAccess(ctx, r.db, backfill.ActionControl))
	_, err = runner.StatusOf(ctx, 1)
	require.ErrorIs(t, err, backfill.ErrRunNotFound)
}

// TestRecordEventCaps: record_event, as a loader, refuses a 6 MB actor, a
// 7 MB detail, a job name over 1000 and a kind over 200 characters with
// SQLSTATE 22023 naming the argument, its length and the cap, and records
// nothing; the library's RecordEvent fits the same values within the caps
// (the actor's head and length, the detail's head, length and a
// detail_truncated flag) and records them.
func TestRecordEventCaps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, batch := rolesRun(t)
	events := func() int {
		var n int
		require.NoError(t, r.admin.Get(&n, `SELECT count(*) FROM backfill.events`))
		return n
	}
	before := events()
	for _, c := range []struct{ q, want string }{
		{`SELECT backfill.record_event($1, 'items', 'note', repeat('a', 6291456), '{}')`, "record_event: the actor is 6291456 characters long; at most 200 are accepted"},
		{`SELECT backfill.record_event($1, 'items', 'note', 'w1', jsonb_build_object('x', repeat('d', 7340032)))`, "record_event: the detail is 7340041 characters long; at most 65536 are accepted"},
		{`SELECT backfill.record_event($1, repeat('j', 1001), 'note', 'w1', '{}')`, "record_event: the job name is 1001 characters long; at most 1000 are accepted"},
		{`SELECT backfill.record_event($1, 'items', repeat('k', 201), 'w1', '{}')`, "record_event: the kind is 201 characters long; at most 200 are accepted"},
	} {
		_, err := r.db.Exec(c.q, batch)
		require.ErrorContains(t, err, c.want, c.q)
		var pe *pq.Error
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "22023", string(pe.Code), c.q)
		require.Less(t, len(pe.Message), 400, "the message does not repeat the text")
	}
	require.Equal(t, before, events(), "nothing recorded")
	// At the caps: recorded.
	_, err := r.db.Exec(`SELECT backfill.record_event($1, repeat('j', 1000), repeat('k', 200), repeat('a', 200), jsonb_build_object('x', repeat('d', 65527)))`, batch)
	require.NoError(t, err)

	// The library fits its values within the caps.
	m := backfill.NewPGManifest("")
	bigActor := strings.Repeat("a", 6<<20)
	detail := []byte(`{"sample": "` + strings.Repeat("d", 7<<20) + `"}`)
	require.NoError(t, m.RecordEvent(ctx, r.db, backfilltype.Event{BatchID: batch, Job: "items", Kind: "note", Actor: bigActor, Detail: detail}))
	var got struct {
		Actor     string `db:"actor"`
		Truncated bool   `db:"truncated"`
		Chars     int    `db:"chars"`
		Head      string `db:"head"`
	}
	require.NoError(t, r.admin.Get(&got, `SELECT actor, (detail->>'detail_truncated')::bool AS truncated,
		(detail->>'detail_characters')::int AS chars, detail->>'detail_head' AS head
		FROM backfill.events WHERE kind = 'note' AND job_name = 'items' ORDER BY id DESC LIMIT 1`))
	require.LessOrEqual(t, len([]rune(got.Actor)), 200)
	require.Contains(t, got.Actor, "6,291,456 characters")
	require.True(t, got.Truncated)
	require.Equal(t, len(detail), got.Chars)
	require.True(t, strings.HasPrefix(got.Head, `{"sample": "ddd`), got.Head[:40])
}

// TestMigrateRecordEventCapsKeepsRoles: migrating a manifest at version 23
// with a loader (PGManifest.Grants) and an operator (OperatorGrants) to
// the latest version leaves record_event's owner, grants, SECURITY
// DEFINER and search path as version 23 left them: the loader may execute
// it, PUBLIC and the operator may not, and the loader's privilege check
// passes.
func TestMigrateRecordEventCapsKeepsRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	m := backfill.NewPGManifest("")
	r.exec(t, `CREATE SCHEMA backfill`)
	r.exec(t, `CREATE TABLE backfill.schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	for v := 1; v <= 23; v++ {
		r.exec(t, m.SQL(pgstore.PgMigrations[v-1]))
		_, err := r.admin.Exec(`INSERT INTO backfill.schema_migrations (version) VALUES ($1)`, v)
		require.NoError(t, err)
	}
	for _, g := range m.Grants(dbName(t, r.admin), r.name) {
		r.exec(t, g)
	}
	operator := r.name + "_ops"
	r.exec(t, `CREATE ROLE `+operator+` NOLOGIN`)
	t.Cleanup(func() {
		_, _ = r.admin.Exec(`DROP OWNED BY ` + operator)
		_, _ = r.admin.Exec(`DROP ROLE ` + operator)
	})
	for _, g := range m.OperatorGrants(operator) {
		// approve comes with version 32 and set_module_flag with 33,
		// which grant them to the operators of earlier versions.
		g = strings.ReplaceAll(g, `, "backfill".set_module_flag(text, text, boolean, text, text)`, "")
		r.exec(t, strings.ReplaceAll(g, `, "backfill".approve(bigint, text, text, text)`, ""))
	}
	type fn struct {
		Owner    string `db:"owner"`
		ACL      string `db:"acl"`
		Definer  bool   `db:"definer"`
		Config   string `db:"config"`
		Loader   bool   `db:"loader"`
		Public   bool   `db:"public"`
		Operator bool   `db:"operator"`
	}
	read := func() fn {
		var f fn
		require.NoError(t, r.admin.Get(&f, `SELECT pg_get_userbyid(p.proowner) AS owner, p.proacl::text AS acl, p.prosecdef AS definer,
			array_to_string(p.proconfig, ',') AS config,
			has_function_privilege($1, p.oid, 'EXECUTE') AS loader,
			EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public,
			has_function_privilege($2, p.oid, 'EXECUTE') AS operator
			FROM pg_proc p WHERE p.oid = 'backfill.record_event(bigint, text, text, text, jsonb)'::regprocedure`, r.name, operator))
		return f
	}
	at23 := read()
	require.True(t, at23.Definer)
	require.True(t, at23.Loader)
	require.False(t, at23.Public)
	require.False(t, at23.Operator)
	require.NoError(t, m.Migrate(ctx, r.admin))
	require.Equal(t, at23, read())
	var approve struct {
		Operator bool `db:"operator"`
		Loader   bool `db:"loader"`
	}
	require.NoError(t, r.admin.Get(&approve, `SELECT has_function_privilege($1, 'backfill.approve(bigint, text, text, text)', 'EXECUTE') AS loader,
		has_function_privilege($2, 'backfill.approve(bigint, text, text, text)', 'EXECUTE') AS operator`, r.name, operator))
	require.True(t, approve.Operator, "an operator of an earlier version may approve")
	require.False(t, approve.Loader, "a loader may not")
	require.NoError(t, r.admin.Get(&approve, `SELECT has_function_privilege($1, 'backfill.set_module_flag(text, text, boolean, text, text)', 'EXECUTE') AS loader,
		has_function_privilege($2, 'backfill.set_module_flag(text, text, boolean, text, text)', 'EXECUTE') AS operator`, r.name, operator))
	require.True(t, approve.Operator, "an operator of an earlier version may switch a module's flag")
	require.False(t, approve.Loader, "a loader may not")
	require.NoError(t, m.CheckPrivileges(ctx, r.db))
	// The migrated function caps, as the loader.
	_, err := r.db.Exec(`SELECT backfill.record_event(NULL, 'items', 'note', repeat('a', 201), '{}')`)
	require.ErrorContains(t, err, "the actor is 201 characters long; at most 200 are accepted")
}
