package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// profileRun (-profile DIR) loads -rows rows once more with each variant:
// once with a CPU profile and a per-phase time breakdown, once with
// auto_explain capturing the plan of every statement; then EXPLAIN
// ANALYZEs the library's merge statements and the baseline's ON CONFLICT
// on one chunk of new keys and one chunk of existing, identical rows.
func (b *bench) profileRun(ctx context.Context) error {
	dir, err := filepath.Abs(filepath.Join(b.o.profile, b.server))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w := b.out
	fmt.Fprintf(w, "## Profile (files in %s)\n\n", dir)
	sqls := map[string]map[string]string{}
	for _, v := range chunkedVariants {
		table := fmt.Sprintf("%s.prof_%s", benchSchema, v)
		if err := b.freshTable(ctx, table); err != nil {
			return err
		}
		c := childOpts{variant: v, table: table, job: "benchload-prof-" + v, rows: b.o.rows, chunk: b.o.chunk,
			cpuProfile: filepath.Join(dir, v+"-load.cpu.pprof"),
			breakdown:  filepath.Join(dir, v+"-load.breakdown.md"),
			sqlOut:     filepath.Join(dir, v+"-sql.json")}
		progress("profile: %s: load with CPU profile and time breakdown", variantName(v))
		if _, err := b.child(ctx, c); err != nil {
			return err
		}
		bd, err := os.ReadFile(c.breakdown)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\nCPU profile: `go tool pprof -top -nodecount=40 %s`\n\n", bd, c.cpuProfile)
		raw, err := os.ReadFile(c.sqlOut)
		if err != nil {
			return err
		}
		m := map[string]string{}
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		sqls[v] = m
		if v == "lib" {
			// A replay of the loaded range (Job.NewRun), profiled too: its
			// merge takes the path of existing keys, whose statements the
			// EXPLAINs below need.
			rc := c
			rc.newRun = true
			rc.cpuProfile = filepath.Join(dir, v+"-replay.cpu.pprof")
			rc.breakdown = filepath.Join(dir, v+"-replay.breakdown.md")
			rc.sqlOut = filepath.Join(dir, v+"-replay-sql.json")
			progress("profile: %s: replay with CPU profile and time breakdown", variantName(v))
			if _, err := b.child(ctx, rc); err != nil {
				return err
			}
			bd, err := os.ReadFile(rc.breakdown)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\nCPU profile of the replay: `go tool pprof -top -nodecount=40 %s`\n\n", bd, rc.cpuProfile)
			raw, err := os.ReadFile(rc.sqlOut)
			if err != nil {
				return err
			}
			rm := map[string]string{}
			if err := json.Unmarshal(raw, &rm); err != nil {
				return err
			}
			for k, q := range rm {
				if _, ok := m[k]; !ok {
					m[k] = q
				}
			}
		}

		ptable := fmt.Sprintf("%s.plan_%s", benchSchema, v)
		if err := b.freshTable(ctx, ptable); err != nil {
			return err
		}
		pc := childOpts{variant: v, table: ptable, job: "benchload-plan-" + v, rows: b.o.rows, chunk: b.o.chunk,
			explain: filepath.Join(dir, v+"-load.plans.txt")}
		progress("profile: %s: load with auto_explain (ANALYZE) on every statement", variantName(v))
		if _, err := b.child(ctx, pc); err != nil {
			return err
		}
		if _, err := b.db.ExecContext(ctx, `DROP TABLE `+ptable); err != nil {
			return err
		}
		if err := b.summarizePlans(pc.explain, v); err != nil {
			return err
		}
	}

	out := &strings.Builder{}
	table := fmt.Sprintf("%s.prof_lib", benchSchema)
	for _, state := range []string{"as loaded (no manual ANALYZE)", "after VACUUM (ANALYZE)"} {
		if strings.HasPrefix(state, "after") {
			if _, err := b.db.ExecContext(ctx, `VACUUM (ANALYZE) `+table); err != nil {
				return err
			}
		}
		var st struct {
			Live     int64          `db:"n_live_tup"`
			Pages    int64          `db:"relpages"`
			Tuples   float64        `db:"reltuples"`
			Analyzed sql.NullString `db:"analyzed"`
		}
		_ = b.db.GetContext(ctx, &st, `SELECT s.n_live_tup, c.relpages, c.reltuples,
			greatest(s.last_analyze, s.last_autoanalyze)::text AS analyzed
			FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid WHERE s.relid = $1::regclass`, table)
		fmt.Fprintf(out, "### EXPLAIN ANALYZE on %s with %s rows, %s: pg_class relpages=%d reltuples=%.0f, last analyze %s\n\n",
			table, thousands(b.o.rows), state, st.Pages, st.Tuples, st.Analyzed.String)
		for _, sc := range []struct {
			name string
			lo   int64
		}{{"a chunk of new keys (first-load path)", b.o.rows}, {"a chunk of existing, identical rows (replay path)", b.o.rows / 2}} {
			if err := b.explainChunk(ctx, out, table, sqls["lib"], sc.name, sc.lo); err != nil {
				return err
			}
		}
	}
	fmt.Fprint(w, out.String())
	if err := os.WriteFile(filepath.Join(dir, "explain.md"), []byte(out.String()), 0o644); err != nil {
		return err
	}
	for _, v := range chunkedVariants {
		if _, err := b.db.ExecContext(ctx, fmt.Sprintf(`DROP TABLE %s.prof_%s`, benchSchema, v)); err != nil {
			return err
		}
	}
	return nil
}

// explainChunk stages ids [lo, lo+chunk) the library's way and the
// baseline's way, each in a transaction that is rolled back, and EXPLAIN
// ANALYZEs the merge statements.
func (b *bench) explainChunk(ctx context.Context, out *strings.Builder, table string, lib map[string]string, name string, lo int64) error {
	hi := lo + b.o.chunk
	fmt.Fprintf(out, "#### %s: ids [%d, %d)\n\n", name, lo, hi)
	get := func(prefix string) string {
		for k, v := range lib {
			if strings.HasPrefix(k, prefix) {
				return v
			}
		}
		return ""
	}
	libStmts := []struct{ label, q string }{
		{"library: duplicate check", get("merge: duplicate check")},
		{"library: lock rows to change, settle an unchanged chunk", get("merge: lock rows to change")},
		{"library: upsert", get("merge: upsert")},
		{"library: UPDATE target FROM staging", get("merge: UPDATE")},
		{"library: INSERT of every staged row (the fresh-insert path; fails on existing keys)", get("merge: INSERT")},
	}
	create, copyIn := get("staging: CREATE TEMP TABLE"), get("staging: prepare COPY")
	if create == "" || copyIn == "" {
		return fmt.Errorf("explain: the library's staging statements were not captured")
	}
	// The library: its own staging table (with the _backfill_row column).
	if err := b.inRolledBackTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, create); err != nil {
			return err
		}
		if err := copyRows(ctx, tx, copyIn, lo, hi, true); err != nil {
			return err
		}
		// The library's planner settings of its merge statements
		// (PGStager.PlannerSettings).
		if _, err := tx.ExecContext(ctx, `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true),
			set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`); err != nil {
			return err
		}
		// Each statement in a savepoint rolled back after it: EXPLAIN
		// ANALYZE runs it, and each is explained on the same staged rows
		// and the same target.
		for _, s := range libStmts {
			if s.q == "" {
				continue
			}
			if _, err := tx.ExecContext(ctx, `SAVEPOINT explain`); err != nil {
				return err
			}
			if err := explain(ctx, tx, out, s.label, s.q); err != nil {
				// The fresh-insert path on existing keys: a duplicate key,
				// which sends the library to the upsert.
				if !strings.Contains(err.Error(), "23505") {
					return err
				}
				fmt.Fprintf(out, "%v\n\n", err)
			}
			if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT explain`); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("explain library statements: %w", err)
	}
	q := newBaselineSQL(table)
	return b.inRolledBackTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, q.create); err != nil {
			return err
		}
		if err := copyRows(ctx, tx, q.copyIn, lo, hi, false); err != nil {
			return err
		}
		return explain(ctx, tx, out, "baseline: INSERT ... ON CONFLICT DO UPDATE ... WHERE IS DISTINCT FROM", q.merge)
	})
}

func (b *bench) inRolledBackTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	return f(tx)
}

func copyRows(ctx context.Context, tx *sql.Tx, copyIn string, lo, hi int64, rowNumber bool) error {
	stmt, err := tx.PrepareContext(ctx, copyIn)
	if err != nil {
		return err
	}
	defer stmt.Close()
	vals := make([]any, len(allColumns), len(allColumns)+1)
	var buf []byte
	for id := lo; id < hi; id++ {
		buf = genRow(id, vals, buf)
		args := vals
		if rowNumber {
			args = append(vals, id-lo+1)
		}
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			return err
		}
	}
	if _, err := stmt.ExecContext(ctx); err != nil {
		return err
	}
	return stmt.Close()
}

func explain(ctx context.Context, tx *sql.Tx, out *strings.Builder, label, q string) error {
	rows, err := tx.QueryContext(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+q)
	if err != nil {
		return fmt.Errorf("%s: %w", label, err)
	}
	defer rows.Close()
	fmt.Fprintf(out, "%s:\n\n```sql\n%s\n```\n\n```text\n", label, q)
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return err
		}
		out.WriteString(line + "\n")
	}
	out.WriteString("```\n\n")
	return rows.Err()
}

var durationRE = regexp.MustCompile(`duration: ([0-9.]+) ms`)

// summarizePlans prints, per statement, how many times it ran and its
// server time (auto_explain with ANALYZE: inflated by the
// instrumentation, use for proportions), and the plans of the merge
// statements at the first, middle and last chunk.
func (b *bench) summarizePlans(path, v string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	type agg struct {
		n     int
		total float64
		ms    []float64
		plans []string
	}
	byLabel := map[string]*agg{}
	var order []string
	for _, n := range strings.Split(string(raw), "-- notice ")[1:] {
		_, msg, _ := strings.Cut(n, "\n")
		m := durationRE.FindStringSubmatch(msg)
		_, qt, ok := strings.Cut(msg, "Query Text: ")
		if m == nil || !ok {
			continue
		}
		ms, _ := strconv.ParseFloat(m[1], 64)
		label := classifyPlan(qt)
		a := byLabel[label]
		if a == nil {
			a = &agg{}
			byLabel[label] = a
			order = append(order, label)
		}
		a.n++
		a.total += ms
		a.ms = append(a.ms, ms)
		a.plans = append(a.plans, strings.TrimSpace(msg))
	}
	w := b.out
	fmt.Fprintf(w, "### Server-side statement times, %s (auto_explain, ANALYZE on: inflated, compare proportions; plans in %s)\n\n", variantName(v), path)
	fmt.Fprintf(w, "| statement | runs | total ms | first chunk ms | middle chunk ms | last chunk ms |\n|---|---:|---:|---:|---:|---:|\n")
	for _, l := range order {
		a := byLabel[l]
		fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f | %.2f |\n", l, a.n, a.total, a.ms[0], a.ms[len(a.ms)/2], a.ms[len(a.ms)-1])
	}
	fmt.Fprintln(w)
	for _, l := range order {
		if !strings.HasPrefix(l, "merge:") && !strings.HasPrefix(l, "baseline:") {
			continue
		}
		a := byLabel[l]
		for _, i := range []int{0, len(a.plans) / 2, len(a.plans) - 1} {
			fmt.Fprintf(w, "%s, run %d of %d:\n\n```text\n%s\n```\n\n", l, i+1, a.n, a.plans[i])
			if a.n == 1 {
				break
			}
		}
	}
	return nil
}

func classifyPlan(queryText string) string {
	n := strings.Join(strings.Fields(queryText), " ")
	if strings.HasPrefix(n, "INSERT INTO") && strings.Contains(n, "ON CONFLICT") {
		return "baseline: INSERT ... ON CONFLICT DO UPDATE"
	}
	if strings.HasPrefix(n, "INSERT INTO "+benchSchema+".base_manifest") {
		return "baseline manifest: INSERT"
	}
	return classify(queryText)
}
