package backfilltest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill"
)

// LongPropertiesEnv names the environment variable that, set to any
// non-empty value, makes the runner properties of [TestMerger] run as full
// rapid checks (rapid's -rapid.checks, 100 by default, with shrinking)
// instead of a few fixed examples each.
const LongPropertiesEnv = "BACKFILL_LONG_PROPERTIES"

// runnerExamples is how many scenarios each runner property tries when
// LongPropertiesEnv is not set.
const runnerExamples = 4

// concurrencyScenario is one job: the rows of each chunk, the order in
// which the chunks are planned and the concurrency of the run compared
// with the run of the chunks in order at Concurrency 1.
type concurrencyScenario struct {
	chunks      [][][]any
	order       []int
	concurrency int
}

// rendezvous holds each extractor, after it wrote its rows, until n of
// them wait (or a short while passed, for the last chunks of a run), so
// that chunks merge at the same time instead of one after the other.
type rendezvous struct {
	mu      sync.Mutex
	n       int
	waiting int
	release chan struct{}
}

func newRendezvous(n int) *rendezvous { return &rendezvous{n: n, release: make(chan struct{})} }

func (r *rendezvous) wait(ctx context.Context) {
	r.mu.Lock()
	r.waiting++
	ch := r.release
	if r.waiting >= r.n {
		close(r.release)
		r.release, r.waiting = make(chan struct{}), 0
	}
	r.mu.Unlock()
	select {
	case <-ch:
		return
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
	r.mu.Lock()
	if r.release == ch { // not released: no longer waiting
		r.waiting--
	}
	r.mu.Unlock()
}

// runnerCase is one case of runnerProperty: a target table and the rows
// of its chunks.
type runnerCase struct {
	// name names the case; the table is "run_" + name.
	name string
	// def and unique are the table's columns and unique key, as
	// [MergerHarness.CreateTable] takes them.
	def    []ColumnDef
	unique []string
	// target is the job's Target; its Table is set to the case's table.
	target backfill.Target
	// gen draws row number row of chunk number chunk, in def's order.
	gen func(rt *rapid.T, chunk, row int) []any
}

// runnerProperty is the permutation property through the real
// [backfill.Runner]: the chunks of a scenario, planned in any order and
// run at any Concurrency from 2 to 8 (several transactions merging the
// same keys at once), leave the table that the chunks in order at
// Concurrency 1 leave; then a new run of the same chunks (a replay)
// inserts and updates nothing and leaves the table as it was.
func runnerProperty(t *testing.T, h MergerHarness, p runnerCase) {
	t.Helper()
	ctx := context.Background()
	table := "run_" + p.name
	h.CreateTable(t, table, p.def, p.unique)
	p.target.Table = table
	n := 0
	run := func(tb require.TestingT, chunks [][][]any, order []int, concurrency int, replay bool) (backfill.Report, [][]any) {
		n++
		if !replay {
			h.Truncate(t, table)
		}
		items := make([]string, len(order))
		for i := range order {
			items[i] = fmt.Sprint(i)
		}
		meet := newRendezvous(concurrency)
		ex := backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range chunks[order[c.Seq]] {
				if err := w.Write(ctx, r...); err != nil {
					return err
				}
			}
			meet.wait(ctx)
			return nil
		})
		r, err := backfill.NewWithDB(h.DB, &backfill.Config{Manifest: h.Manifest, Merger: h.Merger,
			Concurrency: concurrency, RetryBackoff: time.Millisecond})
		require.NoError(tb, err)
		// A check that takes a moment, as real checks do, keeps each merge
		// open for a while after it wrote: the chunks' transactions overlap.
		slow := backfill.ValidatorFunc(func(ctx context.Context, _ sqlx.ExtContext, _ backfill.ValidationScope) (backfill.CheckResult, error) {
			time.Sleep(3 * time.Millisecond)
			return backfill.CheckResult{Check: "pause", Severity: backfill.SeverityWarn, Passed: true}, nil
		})
		job := backfill.Job{Name: fmt.Sprintf("%s_%d", table, n), Chunker: backfill.List(items...), Extractor: ex,
			Target: p.target, Rollback: backfill.RollbackNone, Validators: []backfill.Validator{slow}}
		if replay {
			job.Name = fmt.Sprintf("%s_%d", table, n-1)
			job.NewRun = true
		}
		rep, err := r.Run(ctx, job)
		require.NoError(tb, err, "concurrency %d", concurrency)
		require.Equal(tb, backfill.RunCompleted, rep.Status)
		return rep, sortRows(h.Rows(t, table))
	}
	check := func(tb require.TestingT, sc concurrencyScenario) {
		identity := make([]int, len(sc.chunks))
		for i := range identity {
			identity[i] = i
		}
		_, want := run(tb, sc.chunks, identity, 1, false)
		_, got := run(tb, sc.chunks, sc.order, sc.concurrency, false)
		if d := cmp.Diff(want, got); d != "" {
			tb.Errorf("order %v at Concurrency %d gives another table than Concurrency 1 (-want +got):\n%s", sc.order, sc.concurrency, d)
			tb.FailNow()
		}
		rep, again := run(tb, sc.chunks, sc.order, sc.concurrency, true)
		if d := cmp.Diff(want, again); d != "" {
			tb.Errorf("a replay at Concurrency %d changed the table (-want +got):\n%s", sc.concurrency, d)
			tb.FailNow()
		}
		require.Zero(tb, rep.Counts.Inserted+rep.Counts.Updated, "a replay writes nothing: %+v", rep.Counts)
	}
	scenario := rapid.Custom(func(rt *rapid.T) concurrencyScenario {
		nChunks := rapid.IntRange(8, 24).Draw(rt, "chunks")
		sc := concurrencyScenario{chunks: make([][][]any, nChunks)}
		for i := range sc.chunks {
			size := rapid.IntRange(1, 8).Draw(rt, "size")
			for j := range size {
				sc.chunks[i] = append(sc.chunks[i], p.gen(rt, i, j))
			}
		}
		identity := make([]int, nChunks)
		for i := range identity {
			identity[i] = i
		}
		sc.order = rapid.Permutation(identity).Draw(rt, "order")
		sc.concurrency = rapid.IntRange(2, 8).Draw(rt, "concurrency")
		return sc
	})
	if os.Getenv(LongPropertiesEnv) != "" {
		rapid.Check(t, func(rt *rapid.T) { check(rt, scenario.Draw(rt, "scenario")) })
		return
	}
	for i := range runnerExamples {
		check(t, scenario.Example(i))
	}
}

// runnerProperties runs runnerProperty for every mode and conflict policy,
// with chunks that share keys: the same key in many chunks with other
// versions, NULL versions, History versions of one key spread over
// chunks (late ones included).
func runnerProperties(t *testing.T, newHarness func(t *testing.T) MergerHarness) {
	prop := func(name string, def []ColumnDef, unique []string, tg backfill.Target, gen func(rt *rapid.T, chunk, row int) []any) {
		t.Run("RunnerProperty/"+name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Manifest == nil {
				t.Skip("the harness has no Manifest")
			}
			runnerProperty(t, h, runnerCase{name: name, def: def, unique: unique, target: tg, gen: gen})
		})
	}
	// SourceWins and TargetWins let the last or the first chunk win when
	// chunks disagree on a key's content, which is order by definition:
	// their chunks agree on shared keys (content a function of the key)
	// and own the keys on which they differ.
	shared := func(rt *rapid.T, chunk, _ int) []any {
		if rapid.Bool().Draw(rt, "shared") {
			id := rapid.IntRange(0, 3).Draw(rt, "id")
			return []any{"s", int64(id), fmt.Sprintf("n%d", id%2)}
		}
		return []any{"o", int64(chunk*10 + rapid.IntRange(0, 2).Draw(rt, "id")), rapid.SampledFrom([]string{"x", "y", "z"}).Draw(rt, "name")}
	}
	for _, c := range []backfill.ConflictPolicy{backfill.SourceWins, backfill.TargetWins} {
		prop(string(c), itemsDef, []string{"tenant", "id"}, backfill.Target{Key: []string{"tenant", "id"}, Conflict: c}, shared)
	}
	// Key "hot" has a version in most chunks, the highest in one; key
	// "null" a NULL version in most chunks and rarely version 1.
	prop("newer_version_wins", productDef, []string{"sku"},
		backfill.Target{Key: []string{"sku"}, Conflict: backfill.NewerVersionWins, Version: "version"},
		func(rt *rapid.T, _, row int) []any {
			name := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "name")
			kind := rapid.IntRange(0, 3).Draw(rt, "kind")
			if row < 2 {
				kind = row
			}
			switch kind {
			case 0:
				return []any{"hot", name, int64(rapid.IntRange(1, 1000).Draw(rt, "version"))}
			case 1:
				var v any
				if rapid.IntRange(0, 15).Draw(rt, "versioned") == 0 {
					v = int64(1)
				}
				return []any{"null", name, v}
			}
			var v any
			if x := rapid.IntRange(0, 6).Draw(rt, "version"); x > 0 {
				v = int64(x)
			}
			return []any{fmt.Sprintf("p%d", rapid.IntRange(0, 3).Draw(rt, "sku")), name, v}
		})
	// The same with an integer key (the PostgreSQL merger locks ranges of
	// its values).
	prop("newer_version_wins_int_key", []ColumnDef{{"id", "bigint"}, {"name", "text"}, {"version", "bigint"}}, []string{"id"},
		backfill.Target{Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "version"},
		func(rt *rapid.T, _, row int) []any {
			name := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "name")
			if row == 0 {
				return []any{int64(7), name, int64(rapid.IntRange(1, 1000).Draw(rt, "version"))}
			}
			return []any{int64(rapid.IntRange(0, 3).Draw(rt, "id") * 5000), name, int64(rapid.IntRange(1, 6).Draw(rt, "version"))}
		})
	prop("append_only", eventsDef, []string{"event_id"},
		backfill.Target{Key: []string{"event_id"}, Mode: backfill.AppendOnly},
		func(rt *rapid.T, _, _ int) []any {
			id := rapid.IntRange(0, 5).Draw(rt, "id")
			return []any{fmt.Sprintf("e%d", id), fmt.Sprintf("k%d", id%2), int64(id * 10)}
		})
	// Customer "hot" has versions in most chunks, late ones included.
	prop("history", historyDef, []string{"customer", "valid_from"},
		backfill.Target{Key: []string{"customer"}, Mode: backfill.History, Columns: []string{"customer", "valid_from", "city"}},
		func(rt *rapid.T, _, row int) []any {
			c, d := "hot", rapid.IntRange(1, 60).Draw(rt, "day")
			if rapid.Bool().Draw(rt, "cold") && row > 0 {
				c, d = fmt.Sprintf("c%d", rapid.IntRange(0, 3).Draw(rt, "customer")), rapid.IntRange(1, 20).Draw(rt, "day")
			}
			var city any
			if (len(c)+d)%3 != 0 {
				city = fmt.Sprintf("city%d", (len(c)*d)%4)
			}
			return []any{c, day(d), city}
		})
	prop("keyless", legacyDef, []string{"name_key"},
		backfill.Target{Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name", "city"},
			Derive: []backfill.KeyRule{{Column: "name_key", From: "name", Rules: []backfill.Normalizer{backfill.CaseFold}}}},
		func(rt *rapid.T, _, _ int) []any {
			k := rapid.IntRange(0, 3).Draw(rt, "k")
			// Keyless keeps the first spelling of a derived key it sees:
			// the chunks agree on it.
			return []any{fmt.Sprintf("Name%d", k), fmt.Sprintf("city%d", k)}
		})
}
