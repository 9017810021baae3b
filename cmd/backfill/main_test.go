package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestMain gives the tests a PostgreSQL server: DATABASE_URL, or a
// throwaway one (internal/pgtest).
func TestMain(m *testing.M) { pgtest.Main(m) }

// cli runs the command in-process with DATABASE_URL=u and returns its exit
// status, stdout and stderr.
func cli(t *testing.T, u string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut, func(k string) string {
		if k == "DATABASE_URL" {
			return u
		}
		return ""
	})
	return code, out.String(), errOut.String()
}

// TestMigrateThenRuntimeRole: migrate creates the manifest, again is a
// no-op, --grant gives a role without any CREATE privilege what Init and
// the privilege check need, and --json prints the versions.
func TestMigrateThenRuntimeRole(t *testing.T) {
	ctx := context.Background()
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	defer admin.Close()
	if _, err := admin.Exec(`CREATE ROLE cli_runtime LOGIN PASSWORD 'pw'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(`DROP OWNED BY cli_runtime`)
		_, _ = admin.Exec(`DROP ROLE cli_runtime`)
	})

	code, out, errOut := cli(t, u, "migrate", "--schema", "ops", "--grant", "cli_runtime", "--json")
	if code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, errOut)
	}
	var res migrateResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate --json: %v: %s", err, out)
	}
	m := backfill.NewPGManifest("ops")
	_, latest, err := m.Version(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != 0 || res.To != latest || res.Schema != "ops" || len(res.Granted) != 6 {
		t.Fatalf("migrate --json: %+v, want from 0 to %d with 6 statements", res, latest)
	}
	code, out, _ = cli(t, u, "migrate", "--schema", "ops")
	if code != 0 || !strings.Contains(out, "nothing to migrate") {
		t.Fatalf("second migrate: exit %d: %s", code, out)
	}

	pu, _ := url.Parse(u)
	pu.User = url.UserPassword("cli_runtime", "pw")
	rt := sqlx.MustOpen("postgres", pu.String())
	defer rt.Close()
	if err := m.Init(ctx, rt); err != nil {
		t.Fatalf("Init as the runtime role after migrate: %v", err)
	}
	if err := m.CheckPrivileges(ctx, rt); err != nil {
		t.Fatalf("privileges of the runtime role after migrate --grant: %v", err)
	}
}

// TestGrants prints the statements for a role and a target, per mode.
func TestGrants(t *testing.T) {
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	defer admin.Close()
	if _, err := admin.Exec(`CREATE SCHEMA app; CREATE TABLE app.events (id int PRIMARY KEY, n serial, m bigint GENERATED ALWAYS AS IDENTITY)`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, u, "grants", "loader", "--table", "app.events", "--mode", "append_only", "--rollback")
	if code != 0 {
		t.Fatalf("grants: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`GRANT USAGE ON SCHEMA "backfill" TO "loader";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "backfill" TO "loader";`,
		`REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON TABLE "backfill".events, "backfill".schema_migrations FROM "loader";`,
		`GRANT EXECUTE ON FUNCTION "backfill".record_event(bigint, text, text, text, jsonb), "backfill".library_control(bigint, text, text) TO "loader";`,
		`GRANT TEMPORARY ON DATABASE "`,
		`GRANT USAGE ON SCHEMA "app" TO "loader";`,
		`GRANT SELECT, INSERT, DELETE ON TABLE "app"."events" TO "loader";`,
		`GRANT USAGE ON SEQUENCE "app"."events_n_seq" TO "loader"; -- serial column "n" of app.events, unless the job writes it`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("grants lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "events_m_seq") {
		t.Errorf("grants names the sequence of an identity column, which needs no privilege:\n%s", out)
	}
	code, out, _ = cli(t, u, "grants", "loader", "--table", "app.events", "--mode", "history", "--json")
	if code != 0 || !strings.Contains(out, `GRANT SELECT, INSERT, UPDATE ON TABLE \"app\".\"events\" TO \"loader\";`) {
		t.Errorf("grants --mode history --json: exit %d:\n%s", code, out)
	}
	if code, _, _ := cli(t, u, "grants"); code != exitUsage {
		t.Errorf("grants without a role: exit %d, want %d", code, exitUsage)
	}
	if code, _, errOut := cli(t, "", "migrate"); code != exitUsage || !strings.Contains(errOut, "DATABASE_URL") {
		t.Errorf("migrate without a database: exit %d, %s", code, errOut)
	}
}

// role creates a login role (name plus a random suffix) on the server of
// u and returns its name and a URL that connects as it; dropped when the
// test ends.
func role(t *testing.T, admin *sqlx.DB, u, name string) (string, string) {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name += "_" + hex.EncodeToString(b)
	if _, err := admin.Exec(`CREATE ROLE ` + name + ` LOGIN PASSWORD 'pw'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(`DROP OWNED BY ` + name)
		_, _ = admin.Exec(`DROP ROLE ` + name)
	})
	pu, _ := url.Parse(u)
	pu.User = url.UserPassword(name, "pw")
	return name, pu.String()
}

// jsonMigrate is the JSON migrate prints.
type jsonMigrate struct {
	From       int              `json:"from_version"`
	To         int              `json:"to_version"`
	Granted    []string         `json:"granted"`
	NotGranted []jsonNotGranted `json:"not_granted"`
}

type jsonNotGranted struct {
	Role      string `json:"role"`
	Object    string `json:"object"`
	Privilege string `json:"privilege"`
	Grant     string `json:"grant"`
	Owner     string `json:"owner"`
}

// TestMigrateGrantVerified: an administrator who owns the manifest's
// schema but not the database, and holds TEMPORARY without grant option
// (here: not at all), runs migrate --grant: PostgreSQL only warns that it
// granted nothing for TEMPORARY. migrate says what was not granted and
// who can grant it, does not list it as granted, and exits 1.
func TestMigrateGrantVerified(t *testing.T) {
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	defer admin.Close()
	owner, ownerURL := role(t, admin, u, "d2admin")
	runtime, _ := role(t, admin, u, "d2")
	var database, dba string
	if err := admin.QueryRow(`SELECT current_database(), pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()`).Scan(&database, &dba); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`CREATE SCHEMA d2m AUTHORIZATION ` + owner, `REVOKE TEMPORARY ON DATABASE "` + database + `" FROM PUBLIC`} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	code, out, errOut := cli(t, ownerURL, "migrate", "--schema", "d2m", "--grant", runtime, "--json")
	if code != exitError {
		t.Fatalf("migrate --grant without grant option: exit %d, want %d: %s %s", code, exitError, out, errOut)
	}
	var res jsonMigrate
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate --json: %v: %s", err, out)
	}
	tempGrant := `GRANT TEMPORARY ON DATABASE "` + database + `" TO "` + runtime + `";`
	for _, g := range res.Granted {
		if g == tempGrant {
			t.Errorf("migrate reports %s as granted", g)
		}
	}
	if len(res.Granted) != 5 {
		t.Errorf("granted %q, want the 5 statements on the schema", res.Granted)
	}
	want := jsonNotGranted{Role: runtime, Object: `database "` + database + `"`, Privilege: "TEMPORARY", Grant: tempGrant, Owner: dba}
	if len(res.NotGranted) != 1 || res.NotGranted[0] != want {
		t.Errorf("not granted: %+v, want %+v", res.NotGranted, want)
	}
	for _, w := range []string{"TEMPORARY", `database "` + database + `"`, tempGrant, `owner "` + dba + `"`, `role "` + runtime + `"`} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q: %s", w, errOut)
		}
	}
	var has bool
	if err := admin.Get(&has, `SELECT has_database_privilege($1, current_database(), 'TEMPORARY')`, runtime); err != nil || has {
		t.Fatalf("has TEMPORARY: %v %v", has, err)
	}
	// Granted by the database's owner, the same call succeeds.
	if code, out, errOut := cli(t, u, "migrate", "--schema", "d2m", "--grant", runtime); code != exitOK || strings.Contains(out, "NOT GRANTED") {
		t.Fatalf("migrate --grant as the database's owner: exit %d: %s %s", code, out, errOut)
	}
}

// TestMigrateConcurrent: N migrate --grant calls at once into a fresh
// schema, all queued behind the migration's lock before any reads the
// version: all succeed (no "tuple concurrently updated" from concurrent
// GRANTs), exactly one reports the migration, the others nothing to
// migrate, and each grants.
func TestMigrateConcurrent(t *testing.T) {
	const n = 6
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	defer admin.Close()
	runtime, _ := role(t, admin, u, "d3")
	// Hold the lock migrate takes, so that every call waits for it.
	tx, err := admin.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(`SELECT pg_advisory_xact_lock(hashtextextended('backfill.migrate:' || 'd3m', 0))`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code     int
		out, err string
	}
	results := make(chan result, n)
	for range n {
		go func() {
			code, out, errOut := cli(t, u, "migrate", "--schema", "d3m", "--grant", runtime, "--json")
			results <- result{code, out, errOut}
		}()
	}
	for waiting := 0; waiting < n; {
		if err := admin.Get(&waiting, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	_, latest, err := backfill.NewPGManifest("d3m").Version(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	migrated := 0
	for range n {
		r := <-results
		if r.code != exitOK {
			t.Errorf("migrate: exit %d: %s", r.code, r.err)
			continue
		}
		var res jsonMigrate
		if err := json.Unmarshal([]byte(r.out), &res); err != nil {
			t.Fatalf("migrate --json: %v: %s", err, r.out)
		}
		if res.From == 0 {
			migrated++
		} else if res.From != latest {
			t.Errorf("migrate: from %d, want 0 or %d", res.From, latest)
		}
		if res.To != latest || len(res.Granted) != 6 {
			t.Errorf("migrate: %+v, want to %d with 6 statements", res, latest)
		}
	}
	if migrated != 1 {
		t.Errorf("%d calls report the migration from version 0, want 1", migrated)
	}
}

// TestMigrateWithoutCreateOnDatabase: a role without CREATE on the
// database migrating into a schema that does not exist is told the
// statement, the privilege, the GRANT and the alternative, with the
// program's prefix once.
func TestMigrateWithoutCreateOnDatabase(t *testing.T) {
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	defer admin.Close()
	name, ru := role(t, admin, u, "d4")
	var database string
	if err := admin.Get(&database, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := cli(t, ru, "migrate", "--schema", "d4m")
	if code != exitError {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, w := range []string{`CREATE SCHEMA "d4m"`, `CREATE on database "` + database + `"`,
		`GRANT CREATE ON DATABASE "` + database + `" TO "` + name + `";`, `CREATE SCHEMA "d4m" AUTHORIZATION "` + name + `"`} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q: %s", w, errOut)
		}
	}
	if strings.Contains(errOut, "backfill: backfill:") {
		t.Errorf("doubled prefix: %s", errOut)
	}
	// The alternative it names works.
	if _, err := admin.Exec(`CREATE SCHEMA d4m AUTHORIZATION ` + name); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := cli(t, ru, "migrate", "--schema", "d4m"); code != exitOK {
		t.Fatalf("migrate into the schema given to it: exit %d: %s", code, errOut)
	}
}
