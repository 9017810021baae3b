package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// TestClusterRestartImmediate: a committed row survives pg_ctl restart
// -m immediate, which cuts the connections open at the time.
func TestClusterRestartImmediate(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, ClusterOptions{TrustNetworks: []string{"10.255.255.0/30"}})
	if err != nil {
		if _, berr := findBinDir(); berr != nil {
			t.Skip(berr)
		}
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	db, err := sqlx.Open("postgres", c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	var before int
	if err := db.GetContext(ctx, &before, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartImmediate(ctx); err != nil {
		t.Fatal(err)
	}
	var v, after int
	// The pooled connection was cut: database/sql retries on a new one
	// (driver.ErrBadConn) or the first query fails; the second must work.
	if err := db.GetContext(ctx, &v, `SELECT v FROM t`); err != nil {
		if err := db.GetContext(ctx, &v, `SELECT v FROM t`); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.GetContext(ctx, &after, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if v != 42 || after == before {
		t.Fatalf("after the restart: v = %d (want 42), backend %d (before %d, want another)", v, after, before)
	}
	var hba int
	if err := db.GetContext(ctx, &hba, `SELECT count(*) FROM pg_hba_file_rules WHERE address = '10.255.255.0'`); err != nil {
		t.Fatal(err)
	}
	if hba != 1 {
		t.Fatalf("pg_hba rules for the trusted network: %d, want 1", hba)
	}
}
