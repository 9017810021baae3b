package backfill_test

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// A first job names five things: Name, Chunker, Extractor, Target.Table
// and Target.Key. Every other field of Job and Target, and of Config, is
// left at its zero value and defaulted: the columns are the table's, the
// mode Upsert, the rollback the undo log when the target has the lineage
// columns. One thing is not defaulted, on purpose: a target without
// lineage columns has no undo log, and the job must then accept
// Rollback: RollbackNone (no backfill runs without a decided way back).
// These tests run such a job against the fakes of backfilltest and
// against PostgreSQL.

// firstJobRows is how many rows firstJob loads, in chunks of 10.
const firstJobRows = 30

// firstJob sets the five fields and nothing else.
func firstJob() backfill.Job {
	return backfill.Job{
		Name:    "first-job",
		Chunker: backfill.IntRange(0, firstJobRows, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprint("v", id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: "first_job", Key: []string{"id"}},
	}
}

// requireOnlyFirstJobFields fails unless job sets Name, Chunker,
// Extractor, Target.Table and Target.Key and nothing else (and, when
// extra is given, those fields of Job too).
func requireOnlyFirstJobFields(t *testing.T, job backfill.Job, extra ...string) {
	t.Helper()
	allowed := append([]string{"Name", "Chunker", "Extractor", "Target"}, extra...)
	v := reflect.ValueOf(job)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		set := !v.Field(i).IsZero()
		require.Equal(t, slices.Contains(allowed, name), set, "Job.%s set: %v", name, set)
	}
	tv := reflect.ValueOf(job.Target)
	for i := range tv.NumField() {
		name := tv.Type().Field(i).Name
		set := !tv.Field(i).IsZero()
		require.Equal(t, name == "Table" || name == "Key", set, "Target.%s set: %v", name, set)
	}
}

// firstJobStore is a store to run firstJob on: a runner with every
// Config field the store allows at zero, over a table first_job (id
// bigint key, v text, and with lineage the bigint backfill_inserted_by
// and backfill_updated_by), and the table's rows, each as its values
// separated by spaces, ordered by id.
type firstJobStore struct {
	name string
	open func(t *testing.T, lineage bool) (r *backfill.Runner, rows func() []string)
}

var firstJobStores = []firstJobStore{
	{"fakes", func(t *testing.T, lineage bool) (*backfill.Runner, func() []string) {
		cols := []backfill.Column{
			{Name: "id", Type: "bigint", BaseType: "int8", NotNull: true},
			{Name: "v", Type: "text", BaseType: "text"},
		}
		if lineage {
			cols = append(cols,
				backfill.Column{Name: "backfill_inserted_by", Type: "bigint", BaseType: "int8"},
				backfill.Column{Name: "backfill_updated_by", Type: "bigint", BaseType: "int8"})
		}
		m := backfilltest.NewMerger()
		m.AddTableColumns("first_job", []string{"id"}, cols...)
		// The fakes are given as the Config's store; nothing else is set.
		r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: backfilltest.NewManifest(), Merger: m})
		require.NoError(t, err)
		return r, func() []string {
			got := m.Rows("first_job")
			slices.SortFunc(got, func(a, b []any) int { return cmp.Compare(a[0].(int64), b[0].(int64)) })
			var out []string
			for _, row := range got {
				out = append(out, strings.TrimSuffix(fmt.Sprintln(row...), "\n"))
			}
			return out
		}
	}},
	{"postgres", func(t *testing.T, lineage bool) (*backfill.Runner, func() []string) {
		db := pgtest.New(t)
		ddl := `CREATE TABLE first_job (id bigint PRIMARY KEY, v text)`
		cols := `id, v`
		if lineage {
			ddl = `CREATE TABLE first_job (id bigint PRIMARY KEY, v text, backfill_inserted_by bigint, backfill_updated_by bigint)`
			cols = `id, v, backfill_inserted_by, backfill_updated_by`
		}
		_, err := db.Exec(ddl)
		require.NoError(t, err)
		r, err := backfill.New(db, nil) // no Config at all
		require.NoError(t, err)
		return r, func() []string {
			var out []string
			require.NoError(t, db.Select(&out, `SELECT concat_ws(' ', `+cols+`) FROM first_job ORDER BY id`))
			return out
		}
	}},
}

// firstJobWant is what firstJob loads, with the lineage of batch when
// batch is not 0.
func firstJobWant(batch int64) []string {
	var out []string
	for id := range firstJobRows {
		row := fmt.Sprint(id, " v", id)
		if batch != 0 {
			row += fmt.Sprint(" ", batch, " ", batch)
		}
		out = append(out, row)
	}
	return out
}

// TestFirstJobFiveFields: with the lineage columns on the target, the
// five fields load every row, a second Run does nothing, and the
// defaulted rollback (the undo log) takes the batch back out.
func TestFirstJobFiveFields(t *testing.T) {
	for _, s := range firstJobStores {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			job := firstJob()
			requireOnlyFirstJobFields(t, job)
			r, rows := s.open(t, true)

			report, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, report.Status)
			require.Equal(t, 3, report.ChunksTotal)
			require.Equal(t, 3, report.ChunksDone)
			require.Equal(t, backfill.Counts{Read: firstJobRows, Inserted: firstJobRows}, report.Counts)
			require.Empty(t, report.Warnings)
			require.Equal(t, firstJobWant(report.BatchID), rows())

			_, err = r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrAlreadyCompleted)

			rb, err := r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: report.BatchID, Actor: "test", Why: "first job"})
			require.NoError(t, err)
			require.Equal(t, firstJobRows, int(rb.Deleted))
			require.Empty(t, rows())
		})
	}
}

// TestFirstJobWithoutLineageNeedsRollback: without the lineage columns
// the five fields are refused before any batch is created, naming the
// field to set; with Rollback: RollbackNone the job loads.
func TestFirstJobWithoutLineageNeedsRollback(t *testing.T) {
	for _, s := range firstJobStores {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			job := firstJob()
			r, rows := s.open(t, false)

			report, err := r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrInvalidConfig)
			require.ErrorContains(t, err, "Job.Rollback = RollbackNone")
			require.ErrorContains(t, err, "backfill_inserted_by, backfill_updated_by")
			require.Zero(t, report.BatchID, "no batch is created")
			require.Empty(t, rows())

			job.Rollback = backfill.RollbackNone
			requireOnlyFirstJobFields(t, job, "Rollback")
			report, err = r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.RunCompleted, report.Status)
			require.Equal(t, backfill.Counts{Read: firstJobRows, Inserted: firstJobRows}, report.Counts)
			require.Equal(t, firstJobWant(0), rows())
		})
	}
}
