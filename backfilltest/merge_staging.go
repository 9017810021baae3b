package backfilltest

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

var _ backfilldriver.MergerStaging = (*Merger)(nil)

// CreateStaging implements [backfilldriver.MergerStaging.CreateStaging]: an
// empty in-memory staging table, unless table exists.
func (m *Merger) CreateStaging(ctx context.Context, db sqlx.ExtContext, table string, info backfill.TableInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.staging == nil {
		m.staging = map[string]map[int][]stagedRow{}
	}
	if m.staging[table] == nil {
		m.staging[table] = map[int][]stagedRow{}
	}
	return nil
}

// StagePersistent implements [backfilldriver.MergerStaging.StagePersistent]: the
// rows reach table when tx, a fake [*Tx], commits.
func (m *Merger) StagePersistent(ctx context.Context, tx sqlx.ExtContext, table string, info backfill.TableInfo, seq int) (backfilldriver.PersistentStager, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, ok := tx.(*Tx); !ok {
		return nil, fmt.Errorf("backfilltest: stage persistent: executor %T is not a *backfilltest.Tx", tx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.staging[table] == nil {
		return nil, fmt.Errorf("backfilltest: stage persistent: no staging table %q (CreateStaging)", table)
	}
	return &persistStager{m: m, tx: tx, table: table, seq: seq}, nil
}

// StageFrom implements [backfilldriver.MergerStaging.StageFrom].
func (m *Merger) StageFrom(ctx context.Context, tx sqlx.ExtContext, info backfill.TableInfo, table string, seq int, rows int64) (backfilldriver.Stager, error) {
	st, err := m.Stage(ctx, tx, info)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	staged := slices.Clone(m.staging[table][seq])
	m.mu.Unlock()
	if int64(len(staged)) != rows {
		return nil, fmt.Errorf("%w: the staging table holds %d rows, the manifest %d", backfill.ErrAccounting, len(staged), rows)
	}
	for _, r := range staged {
		if err := st.Add(ctx, r.row, r.values); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// DropStaging implements [backfilldriver.MergerStaging.DropStaging]; in a fake
// transaction the table goes on commit.
func (m *Merger) DropStaging(ctx context.Context, tx sqlx.ExtContext, table string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return apply(tx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.staging, table)
	})
}

// persistStager adds a chunk's rows to a persistent staging table on
// commit of its transaction.
type persistStager struct {
	m     *Merger
	tx    sqlx.ExtContext
	table string
	seq   int
	rows  []stagedRow
	ended bool
}

func (s *persistStager) Add(ctx context.Context, row int64, values []any) error {
	if s.ended {
		return backfill.ErrWriterClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.rows = append(s.rows, stagedRow{row, slices.Clone(values)})
	return nil
}

// Merge ends the staging: the rows are added to the table on commit.
func (s *persistStager) Merge(ctx context.Context) (backfilltype.MergeResult, error) {
	if s.ended {
		return backfilltype.MergeResult{}, backfill.ErrWriterClosed
	}
	s.ended = true
	if err := ctx.Err(); err != nil {
		return backfilltype.MergeResult{}, err
	}
	rows := s.rows
	return backfilltype.MergeResult{}, apply(s.tx, func() {
		s.m.mu.Lock()
		defer s.m.mu.Unlock()
		if t := s.m.staging[s.table]; t != nil {
			t[s.seq] = append(t[s.seq], rows...)
		}
	})
}

func (s *persistStager) Staged() int64 { return int64(len(s.rows)) }

func (s *persistStager) Close() error {
	s.ended = true
	return nil
}
