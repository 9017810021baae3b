package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestLoadAndRollbackLeastPrivilege runs the flights job (and the
// airports job before it) as a role with only the minimal privileges:
// USAGE on the manifest's schema and DML on its tables, TEMPORARY on the
// database, SELECT and INSERT on the targets (a first load only inserts:
// no UPDATE), after an administrator created the tables and migrated the
// manifest. Every row is accounted for; then, with DELETE granted, the
// same role rolls the flights batch back and the table is empty again.
func TestLoadAndRollbackLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rows := synthetic(11, 2000, 3)
	src := open(t, writeParquet(t, rows, 400), 64)
	airportsPath := filepath.Join(t.TempDir(), airportsFile)
	airports := "iata,name,city,state,country,latitude,longitude\n" +
		"ABE,Lehigh Valley,Allentown,PA,USA,40.65,-75.44\n" +
		"BOS,Logan,Boston,MA,USA,42.36,-71.00\n"
	if err := os.WriteFile(airportsPath, []byte(airports), 0o644); err != nil {
		t.Fatal(err)
	}

	// The administrator: tables, manifest, role, grants.
	u := pgtest.NewURL(t)
	admin := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { admin.Close() })
	exec := func(q string) {
		t.Helper()
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(schemaDDL)
	manifest := backfill.NewPGManifest("")
	if err := manifest.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	role := "flights_" + hex.EncodeToString(b)
	exec(`CREATE ROLE ` + role + ` LOGIN PASSWORD 'pw'`)
	var database string
	if err := admin.GetContext(ctx, &database, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	// TEMPORARY by grant only, not through PUBLIC.
	exec(`REVOKE TEMPORARY ON DATABASE "` + database + `" FROM PUBLIC`)
	grants := manifest.Grants(database, role)
	for _, table := range []string{"airports", "flights"} {
		g, err := backfill.TargetGrants(role, backfill.Target{Table: table}, backfill.GrantOptions{InsertOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g...)
	}
	for _, g := range grants {
		exec(g)
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.UserPassword(role, "pw")
	db := sqlx.MustOpen("postgres", pu.String())
	t.Cleanup(func() {
		db.Close()
		_, _ = admin.Exec(`DROP OWNED BY ` + role)
		_, _ = admin.Exec(`DROP ROLE ` + role)
	})
	var may struct {
		Update bool `db:"u"`
		Delete bool `db:"d"`
		Create bool `db:"c"`
	}
	if err := db.GetContext(ctx, &may, `SELECT has_table_privilege('flights', 'UPDATE') AS u, has_table_privilege('flights', 'DELETE') AS d,
		has_database_privilege(current_database(), 'CREATE') OR has_schema_privilege('public', 'CREATE') OR has_schema_privilege('backfill', 'CREATE') AS c`); err != nil {
		t.Fatal(err)
	}
	if may.Update || may.Delete || may.Create {
		t.Fatalf("the role has more than the minimal privileges: %+v", may)
	}

	// The run, as the role.
	first, end, _ := src.Scope()
	days := backfill.Days(first, end, time.UTC)
	var out bytes.Buffer
	rep, err := load(ctx, &out, db, nil, src, days, airportsPath, options{concurrency: 2, noCreate: true})
	if err != nil {
		t.Fatalf("load as %s: %v\n%s", role, err, out.String())
	}
	c := rep.Counts
	if rep.Status != backfill.RunCompleted || c.Read != int64(len(rows)) || c.Read != c.Inserted+c.Updated+c.Unchanged+c.Rejected+c.Deduplicated || c.Inserted == 0 {
		t.Fatalf("flights run %s, counts %+v for %d rows\n%s", rep.Status, c, len(rows), out.String())
	}
	var n int64
	if err := admin.GetContext(ctx, &n, `SELECT count(*) FROM flights WHERE backfill_inserted_by = $1`, rep.BatchID); err != nil || n != c.Inserted {
		t.Fatalf("flights holds %d rows of batch %d (%v), want %d", n, rep.BatchID, err, c.Inserted)
	}

	// The rollback, as the role, once an administrator granted DELETE.
	exec(`GRANT DELETE ON flights TO ` + role)
	runner, err := backfill.New(db, &backfill.Config{Manifest: manifest})
	if err != nil {
		t.Fatal(err)
	}
	job := backfill.Job{Name: flightsJob, Source: flightsSrc, CodeVersion: codeVersion, Chunker: days, Extractor: src,
		Target: backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns}}
	rb, err := runner.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep.BatchID, Actor: role, Why: "least privilege test"})
	if err != nil {
		t.Fatalf("rollback as %s: %v", role, err)
	}
	if rb.Deleted != c.Inserted {
		t.Errorf("rollback deleted %d rows, want %d", rb.Deleted, c.Inserted)
	}
	if err := admin.GetContext(ctx, &n, `SELECT count(*) FROM flights`); err != nil || n != 0 {
		t.Errorf("flights holds %d rows after the rollback (%v), want 0", n, err)
	}
	run, err := manifest.Run(ctx, admin, rep.BatchID)
	if err != nil || run.Status != backfill.RunRolledBack {
		t.Errorf("batch %d status %q (%v), want %q", rep.BatchID, run.Status, err, backfill.RunRolledBack)
	}
}
