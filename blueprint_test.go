package backfill_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/stretchr/testify/require"
)

var updateBlueprint = flag.Bool("update-blueprint", false, "rewrite testdata/blueprint*.golden.*")

// golden compares got with testdata/name, rewriting it with -update-blueprint.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateBlueprint {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), got, "%s (rewrite with -update-blueprint)", path)
}

// blueprintJob is the items job with validators, an approval policy and
// declared time semantics.
func blueprintJob(s *itemsSetup) backfill.Job {
	job := s.job(1)
	job.Validators = []backfill.Validator{backfill.DuplicateKeys{}, backfill.CheckExceptionRate{MaxRate: 0.01}}
	job.Approval = backfill.ApprovalPolicy{Approvers: 2}
	job.MaxRunRejectRate = 0.05
	return job
}

// TestBlueprintGolden: the blueprint of a job not started, as text and
// JSON, field by field in a stable order; making it writes nothing.
func TestBlueprintGolden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	runner, err := backfill.New(s.db, &backfill.Config{Concurrency: 2, MemoryBudget: 48 << 20, StatementTimeout: time.Minute, JobConcurrency: 3})
	require.NoError(t, err)
	b, err := runner.Blueprint(ctx, blueprintJob(s))
	require.NoError(t, err)
	js, err := json.MarshalIndent(b, "", "  ")
	require.NoError(t, err)
	golden(t, "blueprint.golden.json", string(js)+"\n")
	golden(t, "blueprint.golden.txt", b.Text())
	var n int
	require.NoError(t, s.db.Get(&n, `SELECT (SELECT count(*) FROM backfill.runs) + (SELECT count(*) FROM backfill.events) + (SELECT count(*) FROM items)`))
	require.Zero(t, n, "a blueprint creates no run, records nothing, writes no row")
	// Its JSON reads back to the same blueprint.
	var back backfill.Blueprint
	require.NoError(t, json.Unmarshal(js, &back))
	require.Equal(t, b.Text(), back.Text())
}

// TestBlueprintDiffAndRecord: Run records the run's blueprint in the
// audit log; the blueprint of a changed job names the run it would
// replace as its previous plan and lists the changed fields (code
// version, scope, validators, target columns, approval), with an
// estimate from the completed run; an unchanged job's blueprint is its
// run's, with no change.
func TestBlueprintDiffAndRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	runner, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	job := s.job(1)
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err)
	var recorded int
	require.NoError(t, s.db.Get(&recorded, `SELECT count(*) FROM backfill.events WHERE batch_id = $1 AND kind = 'blueprint'`, rep.BatchID))
	require.Equal(t, 1, recorded)

	same, err := runner.Blueprint(ctx, job)
	require.NoError(t, err)
	require.Equal(t, rep.BatchID, same.BatchID)
	require.Equal(t, backfill.RunCompleted, same.Status)
	require.Nil(t, same.Previous)

	changed := job
	changed.CodeVersion = "v2"
	changed.Chunker = backfill.IntRange(0, 2000, 100)
	changed.Validators = []backfill.Validator{backfill.CheckExceptionRate{MaxRate: 0.02}}
	changed.Target.Columns = []string{"tenant", "id", "name", "amount"}
	changed.Approval = backfill.ApprovalPolicy{Approvers: 1, AuthorMayApprove: true}
	b, err := runner.Blueprint(ctx, changed)
	require.NoError(t, err)
	require.Zero(t, b.BatchID)
	require.Equal(t, &backfilltype.BlueprintPrevious{BatchID: rep.BatchID, Status: backfill.RunCompleted, Fingerprint: same.Fingerprint}, b.Previous)
	require.Equal(t, []string{
		`code_version: "v1" -> "v2"`,
		`scope: "int [0, 1000) step 100" -> "int [0, 2000) step 100"`,
		`scope.chunks: "10" -> "20"`,
		`scope.last_chunk: "int:900/1000" -> "int:1900/2000"`,
		`job.items.target.columns: "[tenant; id; name; amount; seen_at]" -> "[tenant; id; name; amount]"`,
		`job.items.validators: "[]" -> "[backfill.CheckExceptionRate {\"Severity\":\"\",\"Name\":\"\",\"MaxRate\":0.02}]"`,
		`approval: "none" -> "1 approvers, author may approve: true"`,
	}, b.Changes)
	require.NotNil(t, b.Scope.EstimatedRows)
	require.Equal(t, int64(2000), *b.Scope.EstimatedRows)
	require.Contains(t, b.Text(), "Changes since the previous plan (batch")
	require.Contains(t, b.Text(), `code_version: "v1" -> "v2"`)
}
