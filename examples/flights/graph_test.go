package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// graphFixture is a small flights file (synthetic rows over nDays), an
// airports file, a database with the tables and the manifest, and the
// graph's inputs.
type graphFixture struct {
	url          string
	db           *sqlx.DB
	rows         []srcRow
	path         string
	src          *Flights
	days         backfill.Chunker
	airportsPath string
}

func newGraphFixture(t *testing.T, seed uint64, n, nDays int) *graphFixture {
	t.Helper()
	ctx := context.Background()
	f := &graphFixture{rows: synthetic(seed, n, nDays)}
	f.path = writeParquet(t, f.rows, 500)
	f.src = open(t, f.path, 64)
	first, end, _ := f.src.Scope()
	f.days = backfill.Days(first, end, time.UTC)
	f.airportsPath = filepath.Join(t.TempDir(), airportsFile)
	airports := "iata,name,city,state,country,latitude,longitude\n" +
		"ABE,Lehigh Valley,Allentown,PA,USA,40.65,-75.44\n" +
		"BOS,Logan,Boston,MA,USA,42.36,-71.00\n" +
		"LAS,McCarran,Las Vegas,NV,USA,36.08,-115.15\n" +
		"PHX,Sky Harbor,Phoenix,AZ,USA,33.43,-112.01\n"
	if err := os.WriteFile(f.airportsPath, []byte(airports), 0o644); err != nil {
		t.Fatal(err)
	}
	f.url = pgtest.NewURL(t)
	f.db = sqlx.MustOpen("postgres", f.url)
	f.db.SetMaxOpenConns(12)
	t.Cleanup(func() { f.db.Close() })
	if _, err := f.db.ExecContext(ctx, schemaDDL+routeStatsDDL); err != nil {
		t.Fatal(err)
	}
	if err := backfill.NewPGManifest("").Migrate(ctx, f.db); err != nil {
		t.Fatal(err)
	}
	return f
}

// operator creates a login role with the operator grant ("backfill
// migrate --grant-operator") and returns its name and a connection as it.
func (f *graphFixture) operator(t *testing.T, prefix string) (string, *sqlx.DB) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	name := prefix + "_" + hex.EncodeToString(b)
	if _, err := f.db.Exec(`CREATE ROLE ` + name + ` LOGIN PASSWORD 'pw'`); err != nil {
		t.Fatal(err)
	}
	for _, g := range backfill.NewPGManifest("").OperatorGrants(name) {
		if _, err := f.db.Exec(g); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
	}
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(name, "pw")
	db := sqlx.MustOpen("postgres", u.String())
	t.Cleanup(func() {
		db.Close()
		_, _ = f.db.Exec(`DROP OWNED BY ` + name)
		_, _ = f.db.Exec(`DROP ROLE ` + name)
	})
	return name, db
}

// checksum is the row count and md5 of table's rows in key order.
func checksum(t *testing.T, db *sqlx.DB, table string) string {
	t.Helper()
	order := map[string]string{"airports": "iata", "flights": "dep_local, origin, destination, seq", "route_stats": "day, origin, destination"}[table]
	var s string
	q := fmt.Sprintf(`SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY %s)), '-') FROM %s t`, order, table)
	if err := db.Get(&s, q); err != nil {
		t.Fatal(err)
	}
	return s
}

// targetRows is the rows of the three target tables.
func targetRows(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT (SELECT count(*) FROM airports) + (SELECT count(*) FROM flights) + (SELECT count(*) FROM route_stats)`); err != nil {
		t.Fatal(err)
	}
	return n
}

// jobRuns counts the runs of the graph's jobs (not of the graph).
func jobRuns(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM backfill.runs WHERE job_name IN ($1, $2, $3)`, airportsJob, flightsJob, routeStatsJob); err != nil {
		t.Fatal(err)
	}
	return n
}

// routeStatsMismatches counts the rows in which route_stats differs from
// the statistics computed afresh from the whole flights table.
func routeStatsMismatches(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	err := db.Get(&n, `WITH fresh AS (
			SELECT dep_local::date AS day, origin, destination, count(*)::int AS flights, (count(*) FILTER (WHERE delay IS NULL))::int AS no_delay,
				round(avg(delay), 2) AS avg_delay, (percentile_cont(0.5) WITHIN GROUP (ORDER BY delay))::numeric(8,1) AS p50_delay, max(delay) AS max_delay
			FROM flights GROUP BY 1, 2, 3)
		SELECT count(*) FROM fresh f FULL JOIN route_stats r USING (day, origin, destination)
		WHERE (f.flights, f.no_delay, f.avg_delay, f.p50_delay, f.max_delay) IS DISTINCT FROM (r.flights, r.no_delay, r.avg_delay, r.p50_delay, r.max_delay)`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func moduleStates(ms []backfill.ModuleStatus) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Name+"="+string(m.State))
	}
	return strings.Join(s, " ")
}

// TestGraphApprovalsFlagsAndRollback is the graph's acceptance on a small
// flights file: the demo prints the blueprint and the graph's run awaits
// two approvals, writing nothing; route_stats disabled by one operator
// and enabled later by another are recorded plan changes (audit events
// with actor, role, reason, old and new; the blueprint's diff) after
// which earlier approvals do not apply, a stale fingerprint and the
// author are refused; approved by two operator roles the graph runs;
// rolling route_stats back leaves airports and flights identical by
// checksum.
func TestGraphApprovalsFlagsAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newGraphFixture(t, 21, 2000, 4)
	db := f.db
	aliceRole, aliceDB := f.operator(t, "alice")
	bobRole, bobDB := f.operator(t, "bob")
	alice, err := backfill.New(aliceDB, nil)
	if err != nil {
		t.Fatal(err)
	}
	bob, err := backfill.New(bobDB, nil)
	if err != nil {
		t.Fatal(err)
	}
	author, err := backfill.New(db, &backfill.Config{WorkerID: "author"})
	if err != nil {
		t.Fatal(err)
	}
	o := options{concurrency: 2, approvers: 2, workerID: "author"}
	load := func() (backfill.GraphReport, string, error) {
		t.Helper()
		var out bytes.Buffer
		rep, err := graphLoad(ctx, &out, db, nil, f.src, f.days, f.airportsPath, o)
		return rep, out.String(), err
	}
	nothingWritten := func(what string) {
		t.Helper()
		if n := targetRows(t, db); n != 0 {
			t.Fatalf("%s: the targets hold %d rows, want none", what, n)
		}
		if n := jobRuns(t, db); n != 0 {
			t.Fatalf("%s: %d runs of the graph's jobs, want none", what, n)
		}
	}
	awaiting := func(what string) backfill.GraphReport {
		t.Helper()
		rep, out, err := load()
		if !errors.Is(err, backfill.ErrAwaitingApproval) || rep.Status != backfill.RunAwaitingApproval {
			t.Fatalf("%s: %v, status %s; want awaiting approval\n%s", what, err, rep.Status, out)
		}
		for _, s := range []string{`Blueprint of graph "flights-graph"`, "module.flights.depends_on:", "module.route_stats.class:", "deferrable",
			"approval:", "awaits approval of plan fingerprint " + rep.Fingerprint} {
			if !strings.Contains(out, s) {
				t.Fatalf("%s: the output lacks %q:\n%s", what, s, out)
			}
		}
		if !strings.Contains(err.Error(), "0 of 2 approvals of plan fingerprint "+rep.Fingerprint) {
			t.Fatalf("%s: %v", what, err)
		}
		return rep
	}
	refused := func(err error, want string) {
		t.Helper()
		if !errors.Is(err, backfill.ErrApprovalRefused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("approval: %v; want it refused: %s", err, want)
		}
	}
	changes := func(want string) {
		t.Helper()
		bp, err := author.GraphBlueprint(ctx, flightsGraph(db, f.src, f.days, f.airportsPath, 2))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range bp.Changes {
			if c == want {
				return
			}
		}
		t.Fatalf("the blueprint's changes %q lack %q", bp.Changes, want)
	}

	// The plan awaits two approvals; nothing is written.
	first := awaiting("first plan")
	nothingWritten("first plan")
	if err := alice.Approve(ctx, first.BatchID, first.Fingerprint, "alice", "three modules"); err != nil {
		t.Fatal(err)
	}
	nothingWritten("one approval of two")

	// Alice disables route_stats: a plan change that abandons the run
	// awaiting approval, with its approval.
	if err := alice.SetModuleEnabled(ctx, graphName, "route_stats", false, "alice", "statistics not reviewed yet"); err != nil {
		t.Fatal(err)
	}
	refused(bob.Approve(ctx, first.BatchID, first.Fingerprint, "bob", "late"), "abandoned")
	changes(`module.route_stats.enabled: "true" -> "false"`)
	second := awaiting("route_stats disabled")
	if second.BatchID == first.BatchID || second.Fingerprint == first.Fingerprint {
		t.Fatalf("the plan with route_stats disabled is batch %d, fingerprint %s: the first plan's", second.BatchID, second.Fingerprint)
	}
	refused(bob.Approve(ctx, second.BatchID, first.Fingerprint, "bob", "the earlier plan"), "stale fingerprint")
	refused(author.Approve(ctx, second.BatchID, second.Fingerprint, "author", "my own plan"), "is its author")
	nothingWritten("stale and author approvals")

	// Two operator roles approve: airports and flights load, route_stats
	// does not.
	if err := alice.Approve(ctx, second.BatchID, second.Fingerprint, "alice", "airports and flights"); err != nil {
		t.Fatal(err)
	}
	if err := bob.Approve(ctx, second.BatchID, second.Fingerprint, "bob", "airports and flights"); err != nil {
		t.Fatal(err)
	}
	rep, out, err := load()
	if err != nil || rep.BatchID != second.BatchID || rep.Status != backfill.RunCompleted {
		t.Fatalf("approved plan: batch %d %s, %v\n%s", rep.BatchID, rep.Status, err, out)
	}
	if got := moduleStates(rep.Modules); got != "airports=completed flights=completed route_stats=disabled" {
		t.Fatalf("modules %s", got)
	}
	if n := checksum(t, db, "route_stats"); n != "0:-" {
		t.Fatalf("route_stats holds %s while disabled", n)
	}
	airports, flights := checksum(t, db, "airports"), checksum(t, db, "flights")
	if strings.HasPrefix(flights, "0:") || strings.HasPrefix(airports, "0:") {
		t.Fatalf("airports %s, flights %s: empty", airports, flights)
	}

	// Bob enables route_stats: another recorded plan change; the
	// approvals of the earlier plans do not carry over.
	if err := bob.SetModuleEnabled(ctx, graphName, "route_stats", true, "bob", "statistics reviewed"); err != nil {
		t.Fatal(err)
	}
	changes(`module.route_stats.enabled: "false" -> "true"`)
	third := awaiting("route_stats enabled")
	if third.BatchID == second.BatchID || third.BatchID == first.BatchID || third.Fingerprint == second.Fingerprint {
		t.Fatalf("the plan with route_stats enabled again is batch %d, fingerprint %s", third.BatchID, third.Fingerprint)
	}
	st, err := alice.Approvals(ctx, third.BatchID)
	if err != nil || len(st.Approvals) != 0 {
		t.Fatalf("the new run has approvals %+v (%v): the earlier ones applied", st.Approvals, err)
	}
	if n := checksum(t, db, "route_stats"); n != "0:-" {
		t.Fatalf("route_stats holds %s before the approvals", n)
	}
	for _, a := range []struct {
		r    *backfill.Runner
		name string
	}{{alice, "alice"}, {bob, "bob"}} {
		if err := a.r.Approve(ctx, third.BatchID, third.Fingerprint, a.name, "with the statistics"); err != nil {
			t.Fatal(err)
		}
	}
	rep, out, err = load()
	if err != nil || rep.BatchID != third.BatchID || rep.Status != backfill.RunCompleted {
		t.Fatalf("approved plan: batch %d %s, %v\n%s", rep.BatchID, rep.Status, err, out)
	}
	if got := moduleStates(rep.Modules); got != "airports=completed flights=completed route_stats=completed" {
		t.Fatalf("modules %s", got)
	}
	if a, fl := checksum(t, db, "airports"), checksum(t, db, "flights"); a != airports || fl != flights {
		t.Fatalf("enabling route_stats changed airports (%s, was %s) or flights (%s, was %s)", a, airports, fl, flights)
	}
	if n := routeStatsMismatches(t, db); n != 0 || strings.HasPrefix(checksum(t, db, "route_stats"), "0:") {
		t.Fatalf("route_stats: %d rows differ from the flights' statistics (%s)", n, checksum(t, db, "route_stats"))
	}

	// The audit: who switched what, as which role, why, from what to what.
	var events []struct {
		Actor string `db:"actor"`
		Role  string `db:"db_role"`
		Old   string `db:"old"`
		New   string `db:"new"`
		Why   string `db:"why"`
		Mod   string `db:"module"`
	}
	if err := db.Select(&events, `SELECT actor, db_role, detail->>'old' AS old, detail->>'new' AS new, detail->>'why' AS why, detail->>'module' AS module
		FROM backfill.events WHERE kind = 'module_flag_set' ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("[{alice %s true false statistics not reviewed yet route_stats} {bob %s false true statistics reviewed route_stats}]", aliceRole, bobRole)
	if got := fmt.Sprint(events); got != want {
		t.Fatalf("module flag events %s, want %s", got, want)
	}
	var approvals []string
	if err := db.Select(&approvals, `SELECT batch_id || ':' || actor || '@' || db_role FROM backfill.events WHERE kind = 'approval_recorded' ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	wantApprovals := []string{
		fmt.Sprintf("%d:alice@%s", first.BatchID, aliceRole),
		fmt.Sprintf("%d:alice@%s", second.BatchID, aliceRole), fmt.Sprintf("%d:bob@%s", second.BatchID, bobRole),
		fmt.Sprintf("%d:alice@%s", third.BatchID, aliceRole), fmt.Sprintf("%d:bob@%s", third.BatchID, bobRole),
	}
	if fmt.Sprint(approvals) != fmt.Sprint(wantApprovals) {
		t.Fatalf("approvals recorded %q, want %q", approvals, wantApprovals)
	}

	// Rolling route_stats back leaves the other modules' rows identical.
	g := flightsGraph(db, f.src, f.days, f.airportsPath, 2)
	reps, err := author.RollbackModule(ctx, g, "route_stats", backfill.RollbackOptions{Actor: "ops", Why: "statistics recomputed elsewhere"})
	if err != nil || len(reps) != 1 || reps[0].Deleted == 0 {
		t.Fatalf("rollback of route_stats: %+v, %v", reps, err)
	}
	if n := checksum(t, db, "route_stats"); n != "0:-" {
		t.Fatalf("route_stats holds %s after its rollback", n)
	}
	if a, fl := checksum(t, db, "airports"), checksum(t, db, "flights"); a != airports || fl != flights {
		t.Fatalf("the rollback of route_stats changed airports (%s, was %s) or flights (%s, was %s)", a, airports, fl, flights)
	}
}

// TestGraphBadInputRefused: a cycle and a dependency on an unknown module
// are refused before anything is written, the error naming them.
func TestGraphBadInputRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newGraphFixture(t, 5, 300, 2)
	r, err := backfill.New(f.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	cycle := flightsGraph(f.db, f.src, f.days, f.airportsPath, 0)
	cycle.Modules[0].DependsOn = []string{"route_stats"}
	unknown := flightsGraph(f.db, f.src, f.days, f.airportsPath, 0)
	unknown.Modules[2].DependsOn = []string{"flights", "weather"}
	for _, tc := range []struct {
		g    backfill.Graph
		want string
	}{
		{cycle, `the dependencies form a cycle: "airports" -> "route_stats" -> "flights" -> "airports"`},
		{unknown, `module "route_stats" depends on unknown module "weather"`},
	} {
		_, err := r.RunGraph(ctx, tc.g)
		if !errors.Is(err, backfill.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("RunGraph: %v; want %s", err, tc.want)
		}
		if _, err := r.GraphBlueprint(ctx, tc.g); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("GraphBlueprint: %v; want %s", err, tc.want)
		}
	}
	var runs, events int
	if err := f.db.Get(&runs, `SELECT count(*) FROM backfill.runs`); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Get(&events, `SELECT count(*) FROM backfill.events`); err != nil {
		t.Fatal(err)
	}
	if n := targetRows(t, f.db); runs+events+n != 0 {
		t.Fatalf("refused graphs wrote %d runs, %d events, %d rows", runs, events, n)
	}
}

// graphChildEnv, set to "URL|PARQUET|AIRPORTS", makes the test binary the
// demo's graph run that TestGraphKilledMidRunConverges kills: its flights
// extractor, in the third day, writes some rows, notes it in table
// reached and blocks there, while the other days and route_stats go on.
const graphChildEnv = "FLIGHTS_GRAPH_TEST_CHILD"

func init() {
	v := os.Getenv(graphChildEnv)
	if v == "" {
		return
	}
	parts := strings.Split(v, "|")
	if err := graphChild(parts[0], parts[1], parts[2]); err != nil {
		os.Stderr.WriteString("graph child: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

func graphChild(u, path, airportsPath string) error {
	ctx := context.Background()
	db, err := sqlx.Open("postgres", u)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(12)
	src, err := openFlights(path, 64)
	if err != nil {
		return err
	}
	first, end, _ := src.Scope()
	block := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Seq != 2 {
			return src.Extract(ctx, c, w)
		}
		return src.Extract(ctx, c, &blockingWriter{RowWriter: w, db: db, after: 100})
	})
	_, err = graphLoad(ctx, os.Stdout, db, nil, block, backfill.Days(first, end, time.UTC), airportsPath,
		options{concurrency: 2, staleAfter: 2 * time.Second, workerID: "killed"})
	return err
}

// blockingWriter blocks for good once it has written after rows, having
// noted it in table reached.
type blockingWriter struct {
	backfill.RowWriter
	db    *sqlx.DB
	after int
	n     int
}

func (w *blockingWriter) Write(ctx context.Context, v ...any) error {
	if w.n == w.after {
		if _, err := w.db.ExecContext(ctx, `INSERT INTO reached VALUES (1)`); err != nil {
			return err
		}
		select {} // until killed
	}
	w.n++
	return w.RowWriter.Write(ctx, v...)
}

// TestGraphKilledMidRunConverges kills the demo's graph run with SIGKILL
// in the middle of a day of flights, once route_stats has committed days
// of its own; a rerun converges: every flight once, route_stats equal
// to the statistics of the whole flights table, every chunk's counts
// balanced, and no route_stats day started before its flights day was
// committed (from the manifest). Rolling flights back then rolls back
// route_stats first, and leaves airports identical.
func TestGraphKilledMidRunConverges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newGraphFixture(t, 31, 3000, 6)
	db := f.db
	if _, err := db.Exec(`CREATE TABLE reached (n int)`); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), graphChildEnv+"="+f.url+"|"+f.path+"|"+f.airportsPath)
	var childOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &childOut, &childOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var mid struct {
			Reached int `db:"reached"`
			Stats   int `db:"stats"`
		}
		err := db.Get(&mid, `SELECT (SELECT count(*) FROM reached) AS reached, (SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
			WHERE r.job_name = $1 AND c.status = 'done') AS stats`, routeStatsJob)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if mid.Reached > 0 && mid.Stats >= 2 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("the demo's run ended before it was killed: %v\n%s", err, childOut.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the demo's run reached no mid-run point (reached %d, route_stats days %d)\n%s", mid.Reached, mid.Stats, childOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	var before struct {
		Flights int `db:"flights"`
		Stats   int `db:"stats"`
	}
	if err := db.Get(&before, `SELECT (SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $1 AND c.status = 'done') AS flights,
		(SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $2 AND c.status = 'done') AS stats`, flightsJob, routeStatsJob); err != nil {
		t.Fatal(err)
	}
	if before.Flights >= 6 || before.Stats >= 6 {
		t.Fatalf("killed after %d flights days and %d route_stats days of 6: not mid-run", before.Flights, before.Stats)
	}

	var out bytes.Buffer
	rep, err := graphLoad(ctx, &out, db, nil, f.src, f.days, f.airportsPath, options{concurrency: 2, staleAfter: 2 * time.Second})
	if err != nil || rep.Status != backfill.RunCompleted {
		t.Fatalf("rerun: %s, %v\n%s", rep.Status, err, out.String())
	}
	if got := moduleStates(rep.Modules); got != "airports=completed flights=completed route_stats=completed" {
		t.Fatalf("modules %s\n%s", got, out.String())
	}

	// Every flight once: the table is the oracle's keyable rows.
	want := oracle(f.rows)
	rejects := 0
	for k, n := range want {
		if strings.HasPrefix(k, "reject") {
			rejects += n
			delete(want, k)
		}
	}
	var got []string
	if err := db.Select(&got, `SELECT to_char(dep_local, 'YYYY-MM-DD HH24:MI:SS') || ' ' || origin || ' ' || destination || ' #' || seq || ' ' || delay FROM flights`); err != nil {
		t.Fatal(err)
	}
	set := map[string]int{}
	for _, r := range got {
		set[r]++
	}
	if len(set) != len(want) || len(got) != len(want) {
		t.Fatalf("flights holds %d rows (%d distinct), want %d", len(got), len(set), len(want))
	}
	for k, n := range want {
		if set[k] != n {
			t.Fatalf("flight %s: %d times, want %d", k, set[k], n)
		}
	}
	if n := routeStatsMismatches(t, db); n != 0 {
		t.Fatalf("route_stats: %d rows differ from the flights' statistics", n)
	}

	// The manifest: every chunk's counts balance, the flights read every
	// source row once, and each route_stats day started after its
	// flights day was committed.
	var acc struct {
		Unbalanced  int   `db:"unbalanced"`
		FlightsRead int64 `db:"flights_read"`
		StatsDays   int   `db:"stats_days"`
		Early       int   `db:"early"`
	}
	if err := db.Get(&acc, `SELECT
		(SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name IN ($1, $2, $3) AND c.status = 'done'
			AND c.rows_read <> c.rows_inserted + c.rows_updated + c.rows_unchanged + c.rows_rejected + c.rows_deduplicated) AS unbalanced,
		(SELECT coalesce(sum(c.rows_read), 0) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $2 AND c.status = 'done') AS flights_read,
		(SELECT count(*) FROM backfill.chunks c JOIN backfill.runs r USING (batch_id) WHERE r.job_name = $3 AND c.status = 'done') AS stats_days,
		(SELECT count(*) FROM backfill.chunks s JOIN backfill.runs rs USING (batch_id)
			WHERE rs.job_name = $3 AND s.status = 'done' AND NOT EXISTS (
				SELECT 1 FROM backfill.chunks c JOIN backfill.runs r USING (batch_id)
				WHERE r.job_name = $2 AND c.status = 'done' AND c.start_at = s.start_at AND c.finished_at <= s.started_at)) AS early`,
		airportsJob, flightsJob, routeStatsJob); err != nil {
		t.Fatal(err)
	}
	if acc.Unbalanced != 0 || acc.FlightsRead != int64(len(f.rows)) || acc.StatsDays != 6 || acc.Early != 0 {
		t.Fatalf("manifest: %d chunks unbalanced, flights read %d of %d rows, %d route_stats days of 6, %d started before their flights day was committed",
			acc.Unbalanced, acc.FlightsRead, len(f.rows), acc.StatsDays, acc.Early)
	}

	// Rolling flights back cascades to route_stats, children first.
	airports := checksum(t, db, "airports")
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := r.RollbackModule(ctx, flightsGraph(db, f.src, f.days, f.airportsPath, 0), "flights", backfill.RollbackOptions{Actor: "ops", Why: "bad flights file"})
	if err != nil || len(reps) != 2 {
		t.Fatalf("rollback of flights: %+v, %v", reps, err)
	}
	var order []string
	for _, rb := range reps {
		var job string
		if err := db.Get(&job, `SELECT job_name FROM backfill.runs WHERE batch_id = $1`, rb.BatchID); err != nil {
			t.Fatal(err)
		}
		order = append(order, job)
	}
	if fmt.Sprint(order) != fmt.Sprint([]string{routeStatsJob, flightsJob}) {
		t.Fatalf("rolled back %q, want route_stats first", order)
	}
	if a, fl, rs := checksum(t, db, "airports"), checksum(t, db, "flights"), checksum(t, db, "route_stats"); a != airports || fl != "0:-" || rs != "0:-" {
		t.Fatalf("after the rollback: airports %s (was %s), flights %s, route_stats %s", a, airports, fl, rs)
	}
	if rejects == 0 {
		t.Fatal("the synthetic file has no unkeyable row")
	}
}

// TestGraphDemoWaitsForApprovals: the demo with -approvers 2 prints the
// blueprint and how to approve, and waits, writing nothing, until two
// operator roles approve the fingerprint; then it runs the graph.
func TestGraphDemoWaitsForApprovals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newGraphFixture(t, 41, 600, 2)
	_, aliceDB := f.operator(t, "alice")
	_, bobDB := f.operator(t, "bob")
	type result struct {
		rep backfill.GraphReport
		err error
	}
	var out bytes.Buffer
	done := make(chan result, 1)
	go func() {
		rep, err := graphLoad(ctx, &out, f.db, nil, f.src, f.days, f.airportsPath, options{concurrency: 2, approvers: 2, waitApproval: true, workerID: "demo"})
		done <- result{rep, err}
	}()
	var run struct {
		BatchID     int64  `db:"batch_id"`
		Fingerprint string `db:"fingerprint"`
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := f.db.Get(&run, `SELECT batch_id, plan_fingerprint AS fingerprint FROM backfill.runs WHERE job_name = $1 AND status = 'awaiting_approval'`, graphName)
		if err == nil {
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			t.Fatalf("the demo returned before the approvals: %+v, %v\n%s", res.rep, res.err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no run of the graph awaits approval")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := targetRows(t, f.db); n != 0 || jobRuns(t, f.db) != 0 {
		t.Fatalf("written before the approvals: %d rows, %d job runs", n, jobRuns(t, f.db))
	}
	for _, a := range []struct {
		db   *sqlx.DB
		name string
	}{{aliceDB, "alice"}, {bobDB, "bob"}} {
		if _, err := a.db.Exec(`SELECT backfill.approve($1, $2, $3, 'blueprint reviewed')`, run.BatchID, run.Fingerprint, a.name); err != nil {
			t.Fatal(err)
		}
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the demo did not run the graph once approved")
	}
	if res.err != nil || res.rep.Status != backfill.RunCompleted || res.rep.BatchID != run.BatchID {
		t.Fatalf("approved: %+v, %v\n%s", res.rep, res.err, out.String())
	}
	for _, s := range []string{`Blueprint of graph "flights-graph"`, "awaits approval of plan fingerprint " + run.Fingerprint,
		"backfill approve --job flights-graph --fingerprint " + run.Fingerprint, "module route_stats  deferrable completed"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the output lacks %q:\n%s", s, out.String())
		}
	}
}
