package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
)

// fakeSetup is a Runner on the fakes of backfilltest with one table,
// readings(sensor, minute, celsius).
type fakeSetup struct {
	manifest *backfilltest.Manifest
	merger   *backfilltest.Merger
	runner   *backfill.Runner
}

func newFakeSetup(t *testing.T) fakeSetup {
	t.Helper()
	s := fakeSetup{manifest: backfilltest.NewManifest(), merger: backfilltest.NewMerger()}
	s.merger.AddTable("readings", []string{"sensor", "minute"}, "sensor", "minute", "celsius")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: s.manifest, Merger: s.merger})
	require.NoError(t, err)
	s.runner = r
	return s
}

// readingsJob writes minutes [0, 40) in chunks of 10; fail(c) makes the
// extractor fail on a chunk.
func readingsJob(mode backfill.PublishMode, fail func(c backfill.Chunk) bool) backfill.Job {
	return backfill.Job{
		Name:    "readings",
		Chunker: backfill.IntRange(0, 40, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if fail != nil && fail(c) {
				return errors.New("source unavailable")
			}
			for minute := c.Lo; minute < c.Hi; minute++ {
				if minute == 25 {
					if err := w.Reject(ctx, map[string]any{"minute": minute}, "celsius", "sensor offline"); err != nil {
						return err
					}
					continue
				}
				if err := w.Write(ctx, "s1", minute, 20.5); err != nil {
					return err
				}
			}
			return nil
		}),
		Rollback: backfill.RollbackNone,
		Publish:  backfill.Publish{Mode: mode},
		Target:   backfill.Target{Table: "readings", Key: []string{"sensor", "minute"}},
	}
}

// The fakes run PublishAtEnd: readers see nothing of the run until every
// chunk is staged, then all of it; a crash (a failed call) keeps what was
// staged.
func TestFakesPublishAtEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFakeSetup(t)
	down := atomic.Bool{}
	down.Store(true)
	extracted := map[string]int{}
	job := readingsJob(backfill.PublishAtEnd, func(c backfill.Chunk) bool {
		extracted[c.ID]++
		return c.Lo == 20 && down.Load()
	})

	rep, err := s.runner.Run(ctx, job)
	var partial *backfill.PartialError
	require.ErrorAs(t, err, &partial)
	require.Equal(t, backfill.RunFailed, rep.Status)
	require.Empty(t, s.merger.Rows("readings"), "nothing is visible before the publish")
	states, err := s.manifest.Chunks(ctx, nil, rep.BatchID)
	require.NoError(t, err)
	var staged int
	for _, st := range states {
		if st.Status == "staged" {
			staged++
		}
	}
	require.Equal(t, 2, staged, "the chunks before the failure are staged: %+v", states)

	down.Store(false)
	job.NewRun = false
	rep, err = s.runner.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Equal(t, 4, rep.ChunksDone)
	require.Equal(t, backfill.Counts{Read: 40, Inserted: 39, Rejected: 1}, rep.Counts)
	require.Len(t, s.merger.Rows("readings"), 39)
	require.Equal(t, 1, extracted["int:0/10"], "a staged chunk is not extracted again")
	exceptions, err := s.manifest.Exceptions(ctx, nil, rep.BatchID)
	require.NoError(t, err)
	require.Len(t, exceptions, 1)
}

// A quality gate that fails at the publish of a run published at its end
// pauses the run with the evidence, on the fakes; AcceptGate resumes it
// and the publish completes.
func TestFakesPublishAtEndGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newFakeSetup(t)
	job := readingsJob(backfill.PublishAtEnd, nil)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		return backfill.CheckResult{Check: "no_chunk_20", Severity: backfill.SeverityError, Passed: sc.Chunk.Lo != 20,
			Expected: "chunk is not [20, 30)", Actual: fmt.Sprint(sc.Chunk)}, nil
	})}

	rep, err := s.runner.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Empty(t, s.merger.Rows("readings"), "the failed publish rolled back")

	_, err = s.runner.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrRunPaused)

	rep, err = s.runner.AcceptGate(ctx, job, "int:20/30", "ops", "known outage")
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
	require.Len(t, s.merger.Rows("readings"), 39)
	events, err := s.manifest.Events(ctx, nil, rep.BatchID)
	require.NoError(t, err)
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	require.Contains(t, kinds, backfilltype.EventGateAccepted)
}

// manifestOnly hides every optional interface of the manifest it wraps
// but the one a Runner requires (ManifestLeases).
type manifestOnly struct {
	backfill.Manifest
	backfilldriver.ManifestLeases
}

// noLeases hides every optional interface of the manifest it wraps.
type noLeases struct{ backfill.Manifest }

// mergerOnly hides the optional interfaces of the Merger it wraps.
type mergerOnly struct{ backfill.Merger }

// undoWriterOnly is a merger that writes the undo log (UndoLogWriter)
// but does not roll back from it (no MergerRollback).
type undoWriterOnly struct {
	backfill.Merger
	backfilldriver.UndoLogWriter
}

// A Manifest without ManifestLeases is refused by NewWithDB, before any
// work, with ErrUnsupported naming the capability: every chunk is leased.
func TestManifestWithoutLeasesRefused(t *testing.T) {
	t.Parallel()
	inner := backfilltest.NewManifest()
	merger := backfilltest.NewMerger()
	merger.AddTable("readings", []string{"sensor", "minute"}, "sensor", "minute", "celsius")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: noLeases{inner}, Merger: merger})
	require.ErrorIs(t, err, backfill.ErrUnsupported)
	require.ErrorContains(t, err, "ManifestLeases")
	require.Nil(t, r)
	_, err = inner.LatestRun(context.Background(), nil, "readings")
	require.ErrorIs(t, err, backfill.ErrRunNotFound, "no batch was created")

	r, err = backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: manifestOnly{inner, inner}, Merger: merger})
	require.NoError(t, err, "ManifestLeases is all a Manifest needs besides the contract")
	rep, err := r.Run(context.Background(), readingsJob("", nil))
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
}

// A job that needs a capability the Runner's Manifest or Merger lacks is
// refused before any run is created, with ErrUnsupported naming it.
func TestMissingCapabilityRefusedBeforeRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	validator := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		return backfill.CheckResult{Check: "ok", Passed: true}, nil
	})
	for _, tc := range []struct {
		name string
		job  func(j backfill.Job) backfill.Job
		want []string
	}{
		{"PublishAtEnd", func(j backfill.Job) backfill.Job { j.Publish.Mode = backfill.PublishAtEnd; return j }, []string{"ManifestStaging"}},
		{"Validators", func(j backfill.Job) backfill.Job { j.Validators = []backfill.Validator{validator}; return j }, []string{"ManifestValidations"}},
		{"PartitionSwap", func(j backfill.Job) backfill.Job {
			j.Publish.Mode, j.ChunkColumn = backfill.PublishPartitionSwap, "minute"
			return j
		}, []string{"ManifestAudit"}},
		{"VersionedView", func(j backfill.Job) backfill.Job {
			j.Publish = backfill.Publish{Mode: backfill.PublishVersionedView, View: "readings_v"}
			return j
		}, []string{"ManifestAudit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inner := backfilltest.NewManifest()
			merger := backfilltest.NewMerger()
			merger.AddTable("readings", []string{"sensor", "minute"}, "sensor", "minute", "celsius")
			r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: manifestOnly{inner, inner}, Merger: merger})
			require.NoError(t, err)
			job := tc.job(readingsJob("", nil))
			_, err = r.Run(ctx, job)
			require.ErrorIs(t, err, backfill.ErrUnsupported)
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			_, err = inner.LatestRun(ctx, nil, job.Name)
			require.ErrorIs(t, err, backfill.ErrRunNotFound, "no batch was created")
		})
	}

	t.Run("UndoLog", func(t *testing.T) {
		t.Parallel()
		// The fakes write and roll back the undo log; wrappers that hide
		// their capabilities do not.
		inner := backfilltest.NewManifest()
		merger := backfilltest.NewMerger()
		merger.AddTableColumns("readings", []string{"sensor", "minute"}, backfill.Column{Name: "sensor"}, backfill.Column{Name: "minute"},
			backfill.Column{Name: "celsius"}, backfill.Column{Name: "backfill_inserted_by"}, backfill.Column{Name: "backfill_updated_by"})
		r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: manifestOnly{inner, inner}, Merger: mergerOnly{merger}})
		require.NoError(t, err)
		job := readingsJob("", nil)
		job.Rollback = backfill.RollbackUndoLog
		_, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrUnsupported)
		require.ErrorContains(t, err, "ManifestUndoLog")
		require.ErrorContains(t, err, "UndoLogWriter")
		_, err = inner.LatestRun(ctx, nil, job.Name)
		require.ErrorIs(t, err, backfill.ErrRunNotFound, "no batch was created")

		_, err = r.Rollback(ctx, job, backfill.RollbackOptions{Preview: true})
		require.ErrorIs(t, err, backfill.ErrUnsupported)
		require.ErrorContains(t, err, "ManifestRollback")
	})

	t.Run("MergerRollback", func(t *testing.T) {
		t.Parallel()
		// A merger that writes the undo log but cannot roll back from it:
		// the batch is refused before anything changes, naming it.
		manifest := backfilltest.NewManifest()
		merger := backfilltest.NewMerger()
		merger.AddTableColumns("readings", []string{"sensor", "minute"}, backfill.Column{Name: "sensor"}, backfill.Column{Name: "minute"},
			backfill.Column{Name: "celsius"}, backfill.Column{Name: "backfill_inserted_by"}, backfill.Column{Name: "backfill_updated_by"})
		r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: manifest, Merger: undoWriterOnly{merger, merger}})
		require.NoError(t, err)
		job := readingsJob("", nil)
		job.Rollback = backfill.RollbackUndoLog
		_, err = r.Run(ctx, job)
		require.NoError(t, err)
		before := merger.Rows("readings")
		_, err = r.Rollback(ctx, job, backfill.RollbackOptions{Actor: "ann", Why: "test"})
		require.ErrorIs(t, err, backfill.ErrUnsupported)
		require.ErrorContains(t, err, "MergerRollback")
		require.Equal(t, before, merger.Rows("readings"), "nothing changed")
	})
}
