package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/quote"
)

// selection is the run a command is about: --job NAME (its latest run)
// or --batch N. A command that only reads (readOnly) also takes the job
// as its one positional argument, and without any names the latest run
// of the manifest's only job; commands that change a run (pause, cancel,
// rollback...) must name it.
type selection struct {
	job      string
	batch    int64
	readOnly bool
}

// args is the cobra.PositionalArgs of a read-only command named name:
// at most one JOB, the same as --job when both are given. It makes the
// selection readOnly.
func (s *selection) args(name string) cobra.PositionalArgs {
	s.readOnly = true
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) > 1:
			return fmt.Errorf("%w: %s takes at most one JOB, got %q", errUsage, name, args)
		case len(args) == 1 && s.job != "" && s.job != args[0]:
			return fmt.Errorf("%w: %s %s --job %s: name the job once", errUsage, name, args[0], s.job)
		case len(args) == 1:
			s.job = args[0]
		}
		return nil
	}
}

// flags adds --job and --batch to f.
func (s *selection) flags(f *pflag.FlagSet) {
	f.StringVar(&s.job, "job", "", "the job whose latest run to show")
	f.Int64Var(&s.batch, "batch", 0, "the batch ID of the run (see \"backfill runs\")")
}

// check refuses a selection that names no run, or a bad batch ID.
func (s *selection) check() error {
	switch {
	case s.batch < 0:
		return fmt.Errorf("%w: --batch %d: a batch ID is positive", errUsage, s.batch)
	case s.job == "" && s.batch == 0 && !s.readOnly:
		return fmt.Errorf("%w: name the run: --job NAME (its latest run) or --batch N (\"backfill runs\" lists them)", errUsage)
	}
	return nil
}

// onlyJob names the manifest's only job, for a read-only selection that
// names none; several jobs are a usage error listing them.
func (s *selection) onlyJob(ctx context.Context, db *sqlx.DB, m *backfill.PGManifest) error {
	var jobs []string
	q := `SELECT job_name FROM ` + pq.QuoteIdentifier(m.Schema()) + `.runs GROUP BY job_name ORDER BY max(batch_id) DESC LIMIT 21`
	if err := db.SelectContext(ctx, &jobs, q); err != nil {
		return fmt.Errorf("list the manifest's jobs: %w", err)
	}
	switch len(jobs) {
	case 0:
		return fmt.Errorf("%w: no run in the manifest (schema %q) yet", errNotFound, m.Schema())
	case 1:
		s.job = jobs[0]
		return nil
	}
	list := quote.Join(jobs[:min(len(jobs), 20)])
	if len(jobs) > 20 {
		list += ", ..."
	}
	return fmt.Errorf("%w: the manifest has runs of several jobs (%s, latest first): name one, as JOB or --job NAME, or give --batch N (\"backfill runs\" lists the runs)", errUsage, list)
}

// run looks the selected run up in m: the batch (which must belong to
// --job when both are given) or the job's latest run of any status.
func (s *selection) run(ctx context.Context, db *sqlx.DB, m *backfill.PGManifest) (backfill.Run, error) {
	if err := s.check(); err != nil {
		return backfill.Run{}, err
	}
	if s.job == "" && s.batch == 0 {
		if err := s.onlyJob(ctx, db, m); err != nil {
			return backfill.Run{}, err
		}
	}
	if s.batch != 0 {
		r, err := m.Run(ctx, db, s.batch)
		if errors.Is(err, backfill.ErrRunNotFound) {
			return r, fmt.Errorf("%w: no batch %d in the manifest (schema %q)", errNotFound, s.batch, m.Schema())
		}
		if err != nil {
			return r, err
		}
		if s.job != "" && r.Job != s.job {
			return r, fmt.Errorf("%w: batch %d is a run of job %q, not %q", errUsage, s.batch, r.Job, s.job)
		}
		return r, nil
	}
	r, err := m.LatestRun(ctx, db, s.job)
	if errors.Is(err, backfill.ErrRunNotFound) {
		return r, fmt.Errorf("%w: no run of job %q in the manifest (schema %q); \"backfill runs\" lists the jobs' runs", errNotFound, s.job, m.Schema())
	}
	return r, err
}

// open checks the selection, connects to the manifest (g.manifest) and
// looks the run up; the caller closes db.
func (s *selection) open(ctx context.Context, g *globals) (*sqlx.DB, *backfill.PGManifest, backfill.Run, error) {
	if err := s.check(); err != nil {
		return nil, nil, backfill.Run{}, err
	}
	db, m, err := g.manifest(ctx, backfill.ActionRead)
	if err != nil {
		return nil, nil, backfill.Run{}, err
	}
	run, err := s.run(ctx, db, m)
	if err != nil {
		_ = db.Close()
		return nil, nil, backfill.Run{}, err
	}
	return db, m, run, nil
}
