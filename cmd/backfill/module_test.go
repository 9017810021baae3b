package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// graphJob loads ids [0, 20) into table in chunks of 10.
func graphJob(t *testing.T, db *sqlx.DB, table string) backfill.Job {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text)`, table))
	require.NoError(t, err)
	return backfill.Job{Name: table, Chunker: backfill.IntRange(0, 20, 10), Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, "x"); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "v"}}}
}

// TestCLIGraph: plan GRAPH prints the graph's blueprint with its
// modules; status GRAPH shows each module's state (a disabled one, its
// dependent held by it); module enable, as an operator, is a recorded
// plan change the next blueprint shows, and refuses without a reason; a
// graph awaiting approval shows its plan's chunks and its approvals.
func TestCLIGraph(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", u)
	t.Cleanup(func() { _ = db.Close() })
	g := backfill.Graph{Name: "routes", Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{graphJob(t, db, "airports")}},
		{Name: "stats", Jobs: []backfill.Job{graphJob(t, db, "stats")}, DependsOn: []string{"airports"}, Disabled: true},
		{Name: "daily", Jobs: []backfill.Job{graphJob(t, db, "daily")}, DependsOn: []string{"stats"}, Class: backfill.ModuleDeferrable},
	}}
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	_, err = r.RunGraph(ctx, g)
	require.ErrorIs(t, err, backfill.ErrGraphIncomplete)

	out := cliOK(t, u, "plan", "routes")
	require.Contains(t, out, `Blueprint of graph "routes"`)
	require.Regexp(t, `(?m)^  module\.stats\.enabled:\s+false$`, out)
	require.Regexp(t, `(?m)^  module\.daily\.depends_on:\s+\[stats\]$`, out)
	require.Regexp(t, `(?m)^  module\.daily\.class:\s+deferrable$`, out)

	out = cliOK(t, u, "status", "routes")
	require.Contains(t, out, "graph routes: batch ")
	require.Regexp(t, `(?m)^airports\s+completed\s+2/2\s+20\s+essential\s+0\s+true\s+-$`, out)
	require.Regexp(t, `(?m)^stats\s+disabled\s+0/2\s+0\s+essential\s+0\s+false\s+airports$`, out)
	require.Regexp(t, `(?m)^daily\s+held by stats\s+0/2\s+0\s+deferrable\s+0\s+true\s+stats$`, out)
	require.Contains(t, out, "daily: held by module stats (disabled)")
	var st backfilltype.GraphStatus
	cliJSON(t, u, &st, "status", "routes")
	require.Equal(t, backfilltype.ModuleHeld, st.Modules[2].State)
	require.Equal(t, "stats", st.Modules[2].HeldBy)

	// An operator enables stats.
	rb := make([]byte, 5)
	_, _ = rand.Read(rb)
	role := "op_" + hex.EncodeToString(rb)
	_, err = db.Exec(`CREATE ROLE ` + role + ` LOGIN PASSWORD 'pw'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP OWNED BY ` + role); _, _ = db.Exec(`DROP ROLE ` + role) })
	for _, gr := range backfill.NewPGManifest("").OperatorGrants(role) {
		_, err := db.Exec(gr)
		require.NoError(t, err)
	}
	pu, err := neturl.Parse(u)
	require.NoError(t, err)
	pu.User = neturl.UserPassword(role, "pw")
	ou := pu.String()
	code, _, errOut := cli(t, ou, "module", "enable", "routes", "stats")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--reason")
	code, _, errOut = cli(t, ou, "module", "enable", "routes", "planes", "--reason", "x")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "graph 'routes' has no module 'planes'")
	var res moduleResult
	cliJSON(t, ou, &res, "module", "enable", "routes", "stats", "--reason", "validated on a sample", "--actor", "alice")
	require.Equal(t, moduleResult{Graph: "routes", Module: "stats", Result: "enabled", Actor: "alice", Reason: "validated on a sample"}, res)
	out = cliOK(t, ou, "module", "enable", "routes", "stats", "--reason", "again", "--actor", "alice")
	require.Contains(t, out, "unchanged")
	var actor, dbRole string
	require.NoError(t, db.QueryRow(`SELECT actor, db_role FROM backfill.events WHERE kind = 'module_flag_set'`).Scan(&actor, &dbRole))
	require.Equal(t, "alice", actor)
	require.Equal(t, role, dbRole)

	b, err := r.GraphBlueprint(ctx, g)
	require.NoError(t, err)
	require.Contains(t, b.Changes, `module.stats.enabled: "false" -> "true"`)
	rep, err := r.RunGraph(ctx, g)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	out = cliOK(t, u, "plan", "routes")
	require.Contains(t, out, `module.stats.enabled: "false" -> "true"`)
	out = cliOK(t, u, "status", "routes")
	require.Regexp(t, `(?m)^daily\s+completed\s+2/2\s+20\s+`, out)

	// A graph awaiting approval: its plan's chunks, its approvals and
	// the command that records one.
	ag := backfill.Graph{Name: "awaiting", Approval: backfill.ApprovalPolicy{Approvers: 1}, Modules: []backfill.Module{
		{Name: "hubs", Jobs: []backfill.Job{graphJob(t, db, "hubs")}}}}
	ar, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	arep, err := ar.RunGraph(ctx, ag)
	require.ErrorIs(t, err, backfill.ErrAwaitingApproval)
	out = cliOK(t, u, "status", "awaiting")
	require.Regexp(t, `(?m)^hubs\s+pending\s+0/2\s+0\s+`, out)
	require.Contains(t, out, "approvals 0 of 1 of plan fingerprint "+arep.Fingerprint)
	require.Contains(t, out, fmt.Sprintf("backfill approve --batch %d --fingerprint %s", arep.BatchID, arep.Fingerprint))
}
