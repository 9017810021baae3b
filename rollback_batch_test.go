package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// byBatchState is everything a rollback may change: every table and view of
// the public schema (rows as text), the partitions of each partitioned
// table, the manifest's runs and chunks, and the audit events of
// rollbacks and pauses.
func byBatchState(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var rels []string
	require.NoError(t, db.Select(&rels, `SELECT quote_ident(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'p') ORDER BY 1`))
	var out []string
	for _, rel := range rels {
		var rows []string
		require.NoError(t, db.Select(&rows, `SELECT row(x.*)::text FROM `+rel+` x ORDER BY 1`))
		for _, r := range rows {
			out = append(out, rel+" "+r)
		}
	}
	var more []string
	require.NoError(t, db.Select(&more, `
		SELECT 'part ' || p.relname || ' ' || c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		UNION ALL SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'public' AND c.relkind = 'v'
		UNION ALL SELECT 'run ' || batch_id || ' ' || status || ' ' || coalesce(last_error, '') FROM backfill.runs
		UNION ALL SELECT 'chunk ' || batch_id || ' ' || seq || ' ' || status FROM backfill.chunks
		UNION ALL SELECT 'event ' || batch_id || ' ' || kind || ' ' || actor || ' ' || detail::text FROM backfill.events
			WHERE kind LIKE 'rollback%' OR kind = 'run_paused'
		ORDER BY 1`))
	return append(out, more...)
}

// byBatchStep is one call of a rollback scenario: the batch (by its index in
// the scenario's runs) and the options.
type byBatchStep struct {
	batch int
	opts  backfill.RollbackOptions
	// fails is a substring of the step's expected error; "" expects none.
	fails string
}

// byBatchCompare runs the scenario twice, on two fresh databases made by
// setup: the same batches loaded by jobs, then the same rollback steps,
// once by Runner.Rollback with the job and once by Runner.RollbackBatch
// with the batch ID only. Every step must give the same report (but its
// Elapsed), the same error and the same state; a preview by batch ID must
// change nothing.
func byBatchCompare(t *testing.T, ddl string, jobs []backfill.Job, rollbackJob func(batch int) backfill.Job, steps []byBatchStep) (last []string) {
	t.Helper()
	ctx := context.Background()
	type result struct {
		rep   backfill.RollbackReport
		err   string
		state []string
	}
	play := func(byBatch bool) []result {
		db := pgtest.New(t)
		_, err := db.Exec(ddl)
		require.NoError(t, err)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		var ids []int64
		for _, j := range jobs {
			rep, err := r.Run(ctx, j)
			require.NoError(t, err)
			ids = append(ids, rep.BatchID)
		}
		var out []result
		for _, s := range steps {
			before := byBatchState(t, db)
			var rep backfill.RollbackReport
			var err error
			if byBatch {
				rep, err = r.RollbackBatch(ctx, ids[s.batch], s.opts)
			} else {
				o := s.opts
				o.BatchID = ids[s.batch]
				rep, err = r.Rollback(ctx, rollbackJob(s.batch), o)
			}
			rep.Elapsed = 0
			res := result{rep: rep, state: byBatchState(t, db)}
			if err != nil {
				res.err = err.Error()
			}
			if byBatch && s.opts.Preview {
				require.Equal(t, before, res.state, "a preview by batch ID changed something")
			}
			out = append(out, res)
		}
		return out
	}
	want, got := play(false), play(true)
	for i := range steps {
		require.Equal(t, want[i].err, got[i].err, "step %d: %+v: error", i, steps[i])
		if steps[i].fails == "" {
			require.Empty(t, got[i].err, "step %d", i)
		} else {
			require.Contains(t, got[i].err, steps[i].fails, "step %d", i)
		}
		require.Equal(t, want[i].rep, got[i].rep, "step %d: %+v: report", i, steps[i])
		require.Equal(t, want[i].state, got[i].state, "step %d: %+v: state", i, steps[i])
	}
	return got[len(got)-1].state
}

// TestRollbackBatchMatchesRollbackByJob: for every merge mode, per chunk
// and published at the end, a rollback by batch ID (the manifest's plan
// only) gives exactly what Runner.Rollback with the job gives: conflicts
// found and refused, previews, a rollback of the later batch, then of the
// earlier one, forced and not, and a repeated rollback.
func TestRollbackBatchMatchesRollbackByJob(t *testing.T) {
	t.Parallel()
	for _, m := range dlvModes {
		for _, atEnd := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/atEnd=%t", m.name, atEnd), func(t *testing.T) {
				t.Parallel()
				jobs := []backfill.Job{
					m.job("j", map[int64]string{1: "same", 2: "old", 7: "gone"}, false),
					m.job("j", map[int64]string{1: "same", 2: "new", 3: "new"}, atEnd),
				}
				for i := range jobs {
					jobs[i].MaxRunRejectRate = -1 // AppendOnly rejects the changed row 2
				}
				ann := func(why string) backfill.RollbackOptions { return backfill.RollbackOptions{Actor: "ann", Why: why} }
				last := byBatchCompare(t, m.ddl, jobs, func(int) backfill.Job { return m.job("j", nil, false) }, []byBatchStep{
					{0, backfill.RollbackOptions{Preview: true}, ""},
					{0, ann("refused: conflicts"), "later batches still applied"},
					{1, backfill.RollbackOptions{Preview: true}, ""},
					{1, ann("the restatement"), ""},
					{0, backfill.RollbackOptions{Preview: true}, ""},
					{0, ann("the first load"), ""},
					{0, ann("again"), ""},
				})
				for _, row := range last {
					require.False(t, strings.HasPrefix(row, "t "), "both batches rolled back, yet %s", row)
				}
			})
		}
	}
	t.Run("CustomLineageHashVersion", func(t *testing.T) {
		// Lineage columns of other names, a hash column, NewerVersionWins
		// and KeepFirst: all read back from the plan.
		t.Parallel()
		job := func(rows ...[]any) backfill.Job {
			return backfill.Job{Name: "v", NewRun: true, Chunker: backfill.IntRange(0, 10, 5), ChunkColumn: "id",
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					for _, r := range rows {
						if id := r[0].(int64); id >= c.Lo && id < c.Hi {
							if err := w.Write(ctx, r...); err != nil {
								return err
							}
						}
					}
					return nil
				}),
				Target: backfill.Target{Table: "v", Key: []string{"id"}, Columns: []string{"id", "name", "ver"}, Conflict: backfill.NewerVersionWins,
					Version: "ver", HashColumn: "row_hash", Duplicates: backfill.KeepFirst, Lineage: backfill.Lineage{InsertedBy: "ins_by", UpdatedBy: "upd_by"}}}
		}
		byBatchCompare(t, `CREATE TABLE v (id bigint PRIMARY KEY, name text, ver int, row_hash bytea, ins_by bigint, upd_by bigint,
				backfill_inserted_by bigint, backfill_updated_by bigint)`,
			[]backfill.Job{job([]any{int64(1), "a", 1}, []any{int64(6), "b", 1}), job([]any{int64(1), "a2", 2}, []any{int64(6), "old", 0}, []any{int64(7), "c", 1})},
			func(int) backfill.Job { return job() }, []byBatchStep{
				{0, backfill.RollbackOptions{Preview: true}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "conflicts"}, "later batches still applied"},
				{1, backfill.RollbackOptions{Preview: true}, ""},
				{1, backfill.RollbackOptions{Actor: "ann", Why: "second"}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "first"}, ""},
			})
	})
	t.Run("Force", func(t *testing.T) {
		t.Parallel()
		m := dlvModes[0]
		jobs := []backfill.Job{m.job("j", map[int64]string{1: "a", 2: "b"}, false), m.job("j", map[int64]string{1: "c"}, false)}
		byBatchCompare(t, m.ddl, jobs, func(int) backfill.Job { return m.job("j", nil, false) }, []byBatchStep{
			{0, backfill.RollbackOptions{Preview: true, Force: true}, ""},
			{0, backfill.RollbackOptions{Force: true, Actor: "bob", Why: "forced"}, ""},
		})
	})
	t.Run("Chunk", func(t *testing.T) {
		t.Parallel()
		m := dlvModes[0] // IntRange(0, 10, 5) by id
		jobs := []backfill.Job{m.job("j", map[int64]string{1: "a", 6: "b"}, false)}
		byBatchCompare(t, m.ddl, jobs, func(int) backfill.Job { return m.job("j", nil, false) }, []byBatchStep{
			{0, backfill.RollbackOptions{Preview: true, ChunkID: "int:5/10"}, ""},
			{0, backfill.RollbackOptions{ChunkID: "int:5/10", Actor: "bob", Why: "one chunk"}, ""},
		})
	})
}

// TestRollbackBatchSwitchesBack: the switch-back mechanism of a versioned
// view and of partition swaps, and a job without a rollback mechanism,
// rolled back by batch ID as by the job.
func TestRollbackBatchSwitchesBack(t *testing.T) {
	t.Parallel()
	t.Run("VersionedView", func(t *testing.T) {
		t.Parallel()
		job := func(version int64) backfill.Job {
			return backfill.Job{Name: "orders", NewRun: true, Chunker: backfill.IntRange(0, 40, 20), ChunkColumn: "id",
				Publish: backfill.Publish{Mode: backfill.PublishVersionedView, View: "orders_current"},
				Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					for id := c.Lo; id < c.Hi; id++ {
						if err := w.Write(ctx, id, id*version); err != nil {
							return err
						}
					}
					return nil
				}),
				Target: backfill.Target{Table: "orders", Key: []string{"id"}, Columns: []string{"id", "amount"}}}
		}
		byBatchCompare(t, `CREATE TABLE orders (id bigint PRIMARY KEY, amount bigint NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`,
			[]backfill.Job{job(1), job(2)}, func(b int) backfill.Job { return job(int64(b + 1)) }, []byBatchStep{
				{1, backfill.RollbackOptions{Preview: true}, ""},
				{1, backfill.RollbackOptions{Actor: "ann", Why: "bad amounts"}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "first"}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "again"}, ""},
			})
	})
	t.Run("PartitionSwap", func(t *testing.T) {
		t.Parallel()
		job := backfill.Job{Name: "sales", NewRun: true, ChunkColumn: "day",
			Chunker: backfill.Days(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2024, 1, 3, 0, 0, 0, 0, time.UTC), time.UTC),
			Publish: backfill.Publish{Mode: backfill.PublishPartitionSwap},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for i := range 5 {
					if err := w.Write(ctx, c.Start.Add(time.Duration(i)*time.Minute), int64(i), int64(2)); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: "sales", Key: []string{"day", "id"}, Columns: []string{"day", "id", "amount"}}}
		byBatchCompare(t, `CREATE TABLE sales (day timestamptz NOT NULL, id int NOT NULL, amount int NOT NULL, PRIMARY KEY (day, id)) PARTITION BY RANGE (day);
			CREATE TABLE sales_d1 PARTITION OF sales FOR VALUES FROM ('2024-01-01 00:00Z') TO ('2024-01-02 00:00Z');
			CREATE TABLE sales_d2 PARTITION OF sales FOR VALUES FROM ('2024-01-02 00:00Z') TO ('2024-01-03 00:00Z');
			INSERT INTO sales SELECT '2024-01-01 00:00Z'::timestamptz + g * interval '1 minute', g, 1 FROM generate_series(0, 9) g;`,
			[]backfill.Job{job}, func(int) backfill.Job { return job }, []byBatchStep{
				{0, backfill.RollbackOptions{Preview: true}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "wrong amounts"}, ""},
				{0, backfill.RollbackOptions{Actor: "ann", Why: "twice"}, ""},
			})
	})
	t.Run("None", func(t *testing.T) {
		t.Parallel()
		m := dlvModes[0]
		job := m.job("j", map[int64]string{1: "a"}, false)
		job.Rollback = backfill.RollbackNone
		byBatchCompare(t, `CREATE TABLE t (id bigint PRIMARY KEY, name text)`, []backfill.Job{job}, func(int) backfill.Job { return job }, []byBatchStep{
			{0, backfill.RollbackOptions{Preview: true}, `planned with rollback "none"`},
			{0, backfill.RollbackOptions{Actor: "ann", Why: "no way back"}, `planned with rollback "none"`},
		})
	})
}

// TestRollbackBatchRefusesIncompletePlan: a recorded plan that lacks a
// field the rollback needs is refused with ErrPlanIncomplete naming the
// field, and nothing changes; so are a bad batch ID and an unknown batch.
func TestRollbackBatchRefusesIncompletePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := dlvModes[2] // History: every field applies
	for _, field := range []string{"job", "target.table", "rollback", "target.key", "target.mode", "target.inserted_by", "target.updated_by",
		"target.valid_from", "target.valid_to"} {
		t.Run(field, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, err := db.Exec(m.ddl)
			require.NoError(t, err)
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			rep, err := r.Run(ctx, m.job("j", map[int64]string{1: "a"}, false))
			require.NoError(t, err)
			path := "{" + field + "}"
			if f, ok := strings.CutPrefix(field, "target."); ok {
				path = "{target," + f + "}"
			}
			// A plan of another version: the field is absent.
			_, err = db.Exec(`UPDATE backfill.runs SET plan = plan #- $1::text[], job_name = CASE WHEN $2 THEN '' ELSE job_name END WHERE batch_id = $3`,
				path, field == "job", rep.BatchID)
			require.NoError(t, err)
			before := byBatchState(t, db)
			for _, preview := range []bool{true, false} {
				_, err = r.RollbackBatch(ctx, rep.BatchID, backfill.RollbackOptions{Preview: preview, Actor: "ann", Why: "t"})
				require.ErrorIs(t, err, backfill.ErrPlanIncomplete)
				require.Contains(t, err.Error(), fmt.Sprintf("%q", field))
			}
			require.Equal(t, before, byBatchState(t, db))
		})
	}
	t.Run("BatchID", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		r, err := backfill.New(db, nil)
		require.NoError(t, err)
		_, err = r.RollbackBatch(ctx, 0, backfill.RollbackOptions{Preview: true})
		require.ErrorIs(t, err, backfill.ErrInvalidConfig)
		_, err = r.RollbackBatch(ctx, 42, backfill.RollbackOptions{Preview: true})
		require.True(t, errors.Is(err, backfill.ErrRunNotFound), "%v", err)
	})
}

// TestPlanJobKeyless: a Keyless plan's derived keys are read back (key
// column, source column, NullAsEmpty) from KeyRule.String, and a Keyless
// undo-log plan without them is refused naming target.derive.
func TestPlanJobKeyless(t *testing.T) {
	t.Parallel()
	rule := backfill.KeyRule{Column: "k(ey)", From: "src (raw)", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}, NullAsEmpty: true}
	plan := backfill.Plan{Job: "j", Rollback: backfill.RollbackUndoLog, Target: backfilltype.PlanTarget{Table: "t", Key: []string{"k(ey)"},
		Mode: backfill.Keyless, Derive: []string{rule.String()}, InsertedBy: "ins", UpdatedBy: "upd"}}
	job, err := backfill.PlanJob(plan)
	require.NoError(t, err)
	require.Len(t, job.Target.Derive, 1)
	got := job.Target.Derive[0]
	require.Equal(t, []string{rule.Column, rule.From}, []string{got.Column, got.From})
	require.True(t, got.NullAsEmpty)
	require.Equal(t, backfill.Lineage{InsertedBy: "ins", UpdatedBy: "upd"}, job.Target.Lineage)

	plan.Target.Derive = nil
	_, err = backfill.PlanJob(plan)
	require.ErrorIs(t, err, backfill.ErrPlanIncomplete)
	require.Contains(t, err.Error(), `"target.derive"`)
	plan.Target.Derive = []string{"not a rule"}
	_, err = backfill.PlanJob(plan)
	require.ErrorIs(t, err, backfill.ErrPlanIncomplete)
}
