package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// stats is a per-phase time breakdown of one load (child -breakdown). The
// library is timed from the outside only, through its public extension
// points: a [backfill.DB] whose statements are timed, and a
// [backfill.Merger] wrapping [pgstore.Merger].
type stats struct {
	mu      sync.Mutex
	m       map[string]*stat
	order   []string
	texts   map[string]string // label -> first SQL text seen
	inMerge bool              // statements now run inside Stager.Merge
}

type stat struct {
	key, parent string
	calls       int64
	items       int64
	d           time.Duration
}

func newStats() *stats { return &stats{m: map[string]*stat{}, texts: map[string]string{}} }

func (s *stats) add(key, parent string, d time.Duration, items int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[key]
	if st == nil {
		st = &stat{key: key, parent: parent}
		s.m[key] = st
		s.order = append(s.order, key)
	}
	st.calls++
	st.items += items
	st.d += d
}

func (s *stats) sql(label, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.texts[label]; !ok {
		s.texts[label] = text
	}
}

func (s *stats) sqlTexts() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.texts))
	for k, v := range s.texts {
		out[k] = v
	}
	return out
}

const mergeKey = "merge: Stager.Merge (end COPY + statements)"

// stmt records one statement of the library, classified by its text.
func (s *stats) stmt(q string, start time.Time) {
	d := time.Since(start)
	// The library sends statements without parameters after the ones it
	// queued (the batched transaction), joined by "; ": each is recorded by its
	// own label, and the time goes to the last, the one that was waited
	// for.
	parts := strings.Split(q, "; ")
	for _, p := range parts {
		s.sql(classify(p), p)
	}
	label := classify(parts[len(parts)-1])
	s.mu.Lock()
	parent := ""
	if s.inMerge {
		parent = mergeKey
	}
	s.mu.Unlock()
	s.add(label, parent, d, 1)
}

func classify(q string) string {
	n := strings.Join(strings.Fields(q), " ")
	switch {
	case strings.Contains(n, "FOR UPDATE SKIP LOCKED") && strings.Contains(n, "chunks"):
		return "manifest: claim chunk (SELECT ... FOR UPDATE SKIP LOCKED)"
	case strings.HasPrefix(n, "CREATE TEMP TABLE"):
		return "staging: CREATE TEMP TABLE IF NOT EXISTS"
	case strings.HasPrefix(n, "SELECT EXISTS (SELECT 1 FROM pg_temp."):
		return "merge: duplicate check (GROUP BY key HAVING count(*) > 1)"
	case strings.HasPrefix(n, "DELETE FROM pg_temp."):
		return "merge: deduplicate"
	case strings.HasPrefix(n, "SELECT FROM pg_temp.") && strings.Contains(n, "FOR UPDATE"):
		return "merge: lock rows to change, settle an unchanged chunk (Upsert)"
	case strings.HasPrefix(n, "WITH j AS MATERIALIZED"):
		return "merge: upsert (WITH j AS MATERIALIZED ... UPDATE, INSERT)"
	case strings.HasPrefix(n, "UPDATE") && strings.Contains(n, "FROM pg_temp."):
		return "merge: UPDATE target FROM staging WHERE IS DISTINCT FROM"
	case strings.HasPrefix(n, "INSERT INTO") && strings.Contains(n, "FROM pg_temp."):
		return "merge: INSERT INTO target SELECT ... FROM staging"
	case strings.HasPrefix(n, "COPY pg_temp."):
		return "staging: prepare COPY"
	case strings.Contains(n, "SET status = 'done'"):
		return "manifest: complete chunk (UPDATE chunks)"
	}
	if len(n) > 60 {
		n = n[:60] + "..."
	}
	return "other: " + n
}

// report renders the breakdown as a Markdown table.
func (s *stats) report(variant string, wall time.Duration, res childResult) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "### Time breakdown: %s, %d rows, wall %.2f s (client CPU %.2f s user + %.2f s sys, server backend CPU %.2f s)\n\n",
		variantName(variant), res.Rows, wall.Seconds(), res.UserCPU, res.SysCPU, res.ServerCPU)
	b.WriteString("| phase | calls | total s | % of wall | µs per row |\n|---|---:|---:|---:|---:|\n")
	rows := float64(max(res.Rows, 1))
	line := func(indent, name string, calls int64, d time.Duration) {
		fmt.Fprintf(&b, "| %s%s | %d | %.3f | %.1f%% | %.2f |\n", indent, name, calls, d.Seconds(), 100*d.Seconds()/wall.Seconds(), float64(d.Microseconds())/rows)
	}
	var top time.Duration
	// Largest first, children under their parent.
	keys := slices.Clone(s.order)
	slices.SortStableFunc(keys, func(a, c string) int { return int(s.m[c].d - s.m[a].d) })
	for _, k := range keys {
		st := s.m[k]
		if st.parent != "" {
			continue
		}
		top += st.d
		line("", k, st.calls, st.d)
		var sum time.Duration
		kids := 0
		for _, ck := range keys {
			if c := s.m[ck]; c.parent == k {
				line("&nbsp;&nbsp;↳ ", ck, c.calls, c.d)
				sum += c.d
				kids++
			}
		}
		if kids > 0 {
			rest := "rest"
			switch k {
			case mergeKey:
				rest = "end COPY (flush the COPY stream, server finishes the COPY)"
			case "extract: Extractor.Extract (generate + RowWriter.Write)":
				rest = "RowWriter.Write: value conversion/validation, rowWriter bookkeeping"
			case "COPY rows (generate + stmt.Exec per row)":
				rest = "stmt.Exec per row (database/sql + lib/pq COPY encoding, sends)"
			}
			line("&nbsp;&nbsp;↳ ", rest+" (derived)", st.calls, st.d-sum)
		}
	}
	line("", "unaccounted (run setup/finish, Go runner, pool)", 0, wall-top)
	fmt.Fprintf(&b, "\nAllocated %.1f MiB in total (%.0f B per row), %d GCs, peak RSS %.1f MiB.\n",
		float64(res.TotalAlloc)/(1<<20), float64(res.TotalAlloc)/rows, res.NumGC, float64(res.VmHWMKiB)/1024)
	return b.String()
}

// timedDB is a [backfill.DB] that times every statement and transaction.
type timedDB struct {
	*sqlx.DB
	st *stats
}

func (d *timedDB) Begin(ctx context.Context) (backfilldriver.Tx, error) {
	t := time.Now()
	tx, err := d.BeginTxx(ctx, nil)
	d.st.add("begin", "", time.Since(t), 1)
	if err != nil {
		return nil, err
	}
	return &timedTx{Tx: tx, st: d.st}, nil
}

func (d *timedDB) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	defer d.st.stmt(q, time.Now())
	return d.DB.ExecContext(ctx, q, args...)
}

func (d *timedDB) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	defer d.st.stmt(q, time.Now())
	return d.DB.QueryContext(ctx, q, args...)
}

func (d *timedDB) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	defer d.st.stmt(q, time.Now())
	return d.DB.QueryxContext(ctx, q, args...)
}

func (d *timedDB) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	defer d.st.stmt(q, time.Now())
	return d.DB.QueryRowxContext(ctx, q, args...)
}

// timedTx is a chunk transaction that times its statements. PrepareContext
// (the stager's COPY) is promoted from *sqlx.Tx, so PGMerger accepts it.
type timedTx struct {
	*sqlx.Tx
	st *stats
}

func (t *timedTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	defer t.st.stmt(q, time.Now())
	return t.Tx.ExecContext(ctx, q, args...)
}

func (t *timedTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	defer t.st.stmt(q, time.Now())
	return t.Tx.QueryContext(ctx, q, args...)
}

func (t *timedTx) QueryxContext(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	defer t.st.stmt(q, time.Now())
	return t.Tx.QueryxContext(ctx, q, args...)
}

func (t *timedTx) QueryRowxContext(ctx context.Context, q string, args ...any) *sqlx.Row {
	defer t.st.stmt(q, time.Now())
	return t.Tx.QueryRowxContext(ctx, q, args...)
}

func (t *timedTx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	defer t.st.stmt(q, time.Now())
	return t.Tx.PrepareContext(ctx, q)
}

func (t *timedTx) Commit() error {
	s := time.Now()
	err := t.Tx.Commit()
	t.st.add("commit", "", time.Since(s), 1)
	return err
}

// timedMerger times the stager's Add and Merge.
type timedMerger struct {
	inner backfill.Merger
	st    *stats
}

func (m *timedMerger) Prepare(ctx context.Context, db sqlx.ExtContext, t backfill.Target) (backfill.TableInfo, error) {
	return m.inner.Prepare(ctx, db, t)
}

func (m *timedMerger) Stage(ctx context.Context, tx sqlx.ExtContext, info backfill.TableInfo) (backfilldriver.Stager, error) {
	s, err := m.inner.Stage(ctx, tx, info)
	if err != nil {
		return nil, err
	}
	return &timedStager{inner: s, st: m.st}, nil
}

type timedStager struct {
	inner backfilldriver.Stager
	st    *stats
	add   time.Duration
	n     int64
}

func (s *timedStager) Add(ctx context.Context, row int64, values []any) error {
	t := time.Now()
	err := s.inner.Add(ctx, row, values)
	s.add += time.Since(t)
	s.n++
	return err
}

func (s *timedStager) Merge(ctx context.Context) (backfilltype.MergeResult, error) {
	s.st.add("Stager.Add (COPY one row: database/sql + lib/pq)", "extract: Extractor.Extract (generate + RowWriter.Write)", s.add, s.n)
	s.add, s.n = 0, 0
	s.st.mu.Lock()
	s.st.inMerge = true
	s.st.mu.Unlock()
	t := time.Now()
	r, err := s.inner.Merge(ctx)
	d := time.Since(t)
	s.st.mu.Lock()
	s.st.inMerge = false
	s.st.mu.Unlock()
	s.st.add(mergeKey, "", d, 1)
	return r, err
}

func (s *timedStager) Close() error { return s.inner.Close() }

// CopyRows forwards the library's one-call COPY (pgstore.PGStager's,
// lib/pq's connection inside sql.Conn.Raw) when the inner stager has
// it, so that a profiled load stages the way an unprofiled one does;
// else the rows are Added one by one, as the library does then.
func (s *timedStager) CopyRows(ctx context.Context, f func() error) error {
	if rc, ok := s.inner.(interface {
		CopyRows(ctx context.Context, f func() error) error
	}); ok {
		return rc.CopyRows(ctx, f)
	}
	return f()
}

// EndStaging forwards the end of the COPY before the merge, when the
// inner stager has it.
func (s *timedStager) EndStaging(ctx context.Context) error {
	if ce, ok := s.inner.(interface {
		EndStaging(ctx context.Context) error
	}); ok {
		return ce.EndStaging(ctx)
	}
	return nil
}
