package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

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
	if res.From != 0 || res.To != latest || res.Schema != "ops" || len(res.Granted) != 4 {
		t.Fatalf("migrate --json: %+v, want from 0 to %d with 4 grants", res, latest)
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
	if _, err := admin.Exec(`CREATE SCHEMA app; CREATE TABLE app.events (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, u, "grants", "loader", "--table", "app.events", "--mode", "append_only", "--rollback")
	if code != 0 {
		t.Fatalf("grants: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		`GRANT USAGE ON SCHEMA "backfill" TO "loader";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "backfill" TO "loader";`,
		`GRANT TEMPORARY ON DATABASE "`,
		`GRANT USAGE ON SCHEMA "app" TO "loader";`,
		`GRANT SELECT, INSERT, DELETE ON TABLE "app"."events" TO "loader";`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("grants lacks %q:\n%s", want, out)
		}
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
