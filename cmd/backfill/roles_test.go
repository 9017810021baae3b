package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
)

// TestRoleMatrix: the manifest's owner (the migrating superuser), a loader
// (migrate --grant), an operator (a login member of the role migrate
// --grant-operator creates) and a stranger (no grant), each against every
// control function (by batch id and by job), the library's functions, direct
// writes of the audit log, schema_migrations, knobs and runs, and the CLI's
// control and read commands. Each statement runs in a transaction rolled
// back afterwards, so the run's state is the same for every role. Every
// refusal is SQLSTATE 42501 naming the object; the CLI's refusals name the
// role, only the privileges the command needs (a stranger's read: USAGE
// and SELECT; its control command: USAGE and EXECUTE on the function) and
// the operator fix.
func TestRoleMatrix(t *testing.T) {
	t.Parallel()
	u, db, _, b2 := loadFares(t)
	loader, loaderURL := role(t, db, u, "loader")
	person, personURL := role(t, db, u, "person")
	stranger, strangerURL := role(t, db, u, "stranger")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	operator := "ops_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP OWNED BY ` + operator)
		_, _ = db.Exec(`DROP ROLE ` + operator)
	})

	var mig jsonMigrate
	code, out, errOut := cli(t, u, "migrate", "--grant", loader, "--grant-operator", operator, "--json")
	require.Equal(t, exitOK, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &mig), out)
	require.Contains(t, mig.Granted, `CREATE ROLE "`+operator+`" NOLOGIN;`)
	require.Empty(t, mig.NotGranted)
	// Again: the role exists, used as it is.
	code, out, errOut = cli(t, u, "migrate", "--grant-operator", operator)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "exists")
	_, err := db.Exec(`GRANT ` + operator + ` TO ` + person)
	require.NoError(t, err)

	conns := map[string]*sqlx.DB{"owner": db}
	for name, cu := range map[string]string{"loader": loaderURL, "operator": personURL, "stranger": strangerURL} {
		c := sqlx.MustOpen("postgres", cu)
		t.Cleanup(func() { _ = c.Close() })
		conns[name] = c
	}
	setStatus := func(status string) {
		t.Helper()
		_, err := db.Exec(`UPDATE backfill.runs SET status = $2, finished_at = NULL WHERE batch_id = $1`, b2, status)
		require.NoError(t, err)
	}
	// try runs q as who in a transaction rolled back, and returns its error.
	try := func(who, q string) error {
		tx, err := conns[who].Beginx()
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.Exec(strings.ReplaceAll(q, "{b}", fmt.Sprint(b2)))
		return err
	}
	all := []string{"owner", "loader", "operator", "stranger"}
	type check struct {
		status  string // the run's status for the check
		q       string
		allowed []string // the roles allowed; the others are refused with 42501
		object  string   // what a refusal names
	}
	control := []string{"owner", "operator"}
	write := []string{"owner", "loader"}
	checks := []check{
		{"running", `SELECT backfill.pause({b}::bigint, 'alice', 'x')`, control, "function pause"},
		{"running", `SELECT backfill.pause('fares', 'alice', 'x')`, control, "function pause"},
		{"running", `SELECT backfill.cancel({b}::bigint, 'alice', 'x')`, control, "function cancel"},
		{"running", `SELECT backfill.cancel('fares', 'alice', 'x')`, control, "function cancel"},
		{"running", `SELECT backfill.set_knob({b}::bigint, 'concurrency', '2', 'alice', 'x')`, control, "function set_knob"},
		{"running", `SELECT backfill.set_knob('fares', 'concurrency', '2', 'alice', 'x')`, control, "function set_knob"},
		{"paused", `SELECT backfill.resume({b}::bigint, 'alice', 'x')`, control, "function resume"},
		{"paused", `SELECT backfill.resume('fares', 'alice', 'x')`, control, "function resume"},
		// The internals of the control functions: the owner's alone.
		{"running", `SELECT backfill.control({b}::bigint, 'pause', 'alice', 'x')`, []string{"owner"}, "function control"},
		{"running", `SELECT backfill.set_knob_apply({b}::bigint, 'concurrency', '2', 'alice', 'x')`, []string{"owner"}, "function set_knob_apply"},
		// The library's: a loader's.
		{"running", `SELECT backfill.library_control({b}::bigint, 'pause', 'SIGTERM')`, write, "function library_control"},
		{"running", `SELECT backfill.record_event({b}, 'fares', 'note', 'w1', '{}')`, write, "function record_event"},
		// Direct writes.
		{"running", `INSERT INTO backfill.events (batch_id, job_name, kind, actor) VALUES ({b}, 'fares', 'run_paused', 'alice')`, []string{"owner"}, "table events"},
		{"running", `DELETE FROM backfill.schema_migrations`, []string{"owner"}, "table schema_migrations"},
		{"running", `INSERT INTO backfill.schema_migrations (version) VALUES (999)`, []string{"owner"}, "table schema_migrations"},
		{"running", `UPDATE backfill.schema_migrations SET applied_at = now()`, []string{"owner"}, "table schema_migrations"},
		{"running", `INSERT INTO backfill.knobs (batch_id, key, value, set_by, reason) VALUES ({b}, 'concurrency', 1, 'alice', 'x')`, write, "table knobs"},
		{"running", `UPDATE backfill.runs SET status = 'paused' WHERE batch_id = {b}`, write, "table runs"},
		// Reads.
		{"running", `SELECT count(*) FROM backfill.events`, []string{"owner", "loader", "operator"}, "schema backfill"},
		{"running", `SELECT count(*) FROM backfill.runs`, []string{"owner", "loader", "operator"}, "schema backfill"},
	}
	for _, c := range checks {
		setStatus(c.status)
		for _, who := range all {
			err := try(who, c.q)
			var pe *pq.Error
			if slices.Contains(c.allowed, who) {
				require.NoError(t, err, "%s: %s", who, c.q)
				continue
			}
			require.Error(t, err, "%s may: %s", who, c.q)
			require.True(t, errors.As(err, &pe), "%s: %s: %v", who, c.q, err)
			require.Equal(t, "42501", string(pe.Code), "%s: %s: %v", who, c.q, err)
			obj := c.object
			if who == "stranger" {
				obj = "schema backfill"
			}
			require.Contains(t, pe.Message, "permission denied for "+obj, "%s: %s", who, c.q)
		}
	}
	// The audit log stays append-only for its owner too.
	require.ErrorContains(t, try("owner", `DELETE FROM backfill.events`), "append-only")
	// The kinds of the control functions are theirs alone.
	require.ErrorContains(t, try("loader", `SELECT backfill.record_event({b}, 'fares', 'run_cancelled', 'alice', '{}')`), "recorded only by the control functions")

	// The CLI, by role.
	setStatus("running")
	bf := fmt.Sprint(b2)
	urls := map[string]string{"owner": u, "loader": loaderURL, "operator": personURL, "stranger": strangerURL}
	names := map[string]string{"loader": loader, "operator": person, "stranger": stranger}
	for _, who := range all {
		setStatus("running")
		for _, args := range [][]string{
			{"pause", "--batch", bf, "--why", "x", "--actor", "alice"},
			{"resume", "--batch", bf, "--why", "x", "--actor", "alice"},
			{"set", "concurrency=2", "--batch", bf, "--why", "x", "--actor", "alice"},
			{"cancel", "--batch", bf, "--why", "x", "--actor", "alice"},
			{"status", "--batch", bf},
			{"events", "--batch", bf},
		} {
			code, out, errOut := cli(t, urls[who], args...)
			read := args[0] == "status" || args[0] == "events"
			switch {
			case who == "owner" || who == "operator" || read && who == "loader":
				require.Equal(t, exitOK, code, "%s %v: %s", who, args, errOut)
			case who == "loader":
				require.NotEqual(t, exitOK, code, "%s %v: %s", who, args, out)
				fn := map[string]string{"pause": "pause", "resume": "resume", "cancel": "cancel", "set": "set_knob"}[args[0]]
				for _, w := range []string{`role "` + loader + `" lacks EXECUTE on function "backfill".` + fn + "(bigint", "--grant-operator", "GRANT OPERATOR TO \"" + loader + `"`} {
					require.Contains(t, errOut, w, "%s %v", who, args)
				}
			default: // the stranger: no USAGE on the schema
				require.NotEqual(t, exitOK, code, "%s %v: %s", who, args, out)
				// Only the privileges of the command, and the operator fix.
				want := []string{`role "` + names[who] + `" lacks USAGE on schema "backfill", `, "--grant-operator", `GRANT OPERATOR TO "` + names[who] + `"`}
				if read {
					want = append(want, `SELECT on tables "backfill".`, "to read the manifest")
				} else {
					fn := map[string]string{"pause": "pause", "resume": "resume", "cancel": "cancel", "set": "set_knob"}[args[0]]
					want = append(want, `EXECUTE on function "backfill"."`+fn+`"(bigint, text, text`, "to run the control functions")
					require.NotContains(t, errOut, "SELECT", "%s %v", who, args)
				}
				for _, w := range want {
					require.Contains(t, errOut, w, "%s %v", who, args)
				}
				for _, w := range []string{"INSERT", "UPDATE", "DELETE", "TEMPORARY", "record_event", "library_control"} {
					require.NotContains(t, errOut, w, "%s %v: a loader's privilege", who, args)
				}
			}
		}
	}
	// The operator's decisions as "alice": actor as given, the login role
	// recorded beside it.
	var rows []struct {
		Kind   string `db:"kind"`
		Actor  string `db:"actor"`
		DBRole string `db:"db_role"`
	}
	require.NoError(t, db.Select(&rows, `SELECT kind, actor, db_role FROM backfill.events
		WHERE batch_id = $1 AND kind IN ('run_paused', 'run_resumed_by_operator', 'knob_set', 'run_cancelled') ORDER BY id`, b2))
	byRole := map[string][]string{}
	for _, r := range rows {
		require.Equal(t, "alice", r.Actor)
		byRole[r.DBRole] = append(byRole[r.DBRole], r.Kind)
	}
	want := []string{"run_paused", "run_resumed_by_operator", "knob_set", "run_cancelled"}
	require.Equal(t, want, byRole[person], "the operator's events, by its login role")
	require.Len(t, byRole, 2, "the owner's and the operator's: %v", byRole)
	out = cliOK(t, u, "events", "--batch", bf, "--json")
	require.Contains(t, out, `"db_role": "`+person+`"`)
}
