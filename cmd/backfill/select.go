package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/spf13/pflag"

	"github.com/pgbackfill/backfill"
)

// selection is the run a command is about: --job NAME (its latest run)
// or --batch N.
type selection struct {
	job   string
	batch int64
}

// flags adds --job and --batch to f.
func (s *selection) flags(f *pflag.FlagSet) {
	f.StringVar(&s.job, "job", "", "the job whose latest run to show")
	f.Int64Var(&s.batch, "batch", 0, "the batch ID of the run to show (see \"backfill runs\")")
}

// check refuses a selection that names no run, or a bad batch ID.
func (s *selection) check() error {
	switch {
	case s.batch < 0:
		return fmt.Errorf("%w: --batch %d: a batch ID is positive", errUsage, s.batch)
	case s.job == "" && s.batch == 0:
		return fmt.Errorf("%w: name the run: --job NAME (its latest run) or --batch N (\"backfill runs\" lists them)", errUsage)
	}
	return nil
}

// run looks the selected run up in m: the batch (which must belong to
// --job when both are given) or the job's latest run of any status.
func (s *selection) run(ctx context.Context, db *sqlx.DB, m *backfill.PGManifest) (backfill.Run, error) {
	if err := s.check(); err != nil {
		return backfill.Run{}, err
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
	db, m, err := g.manifest(ctx)
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
