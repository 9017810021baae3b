package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

func (s *persistStager) EndStaging(ctx context.Context) error {
	s.ended = true
	return finishCopy(ctx, &s.copy)
}

// createStageTable creates the run's persistent staging table once.
func createStageTable(ctx context.Context, db sqlx.ExtContext, table string, info backfilltype.TableInfo) error {
	defs := make([]string, 0, len(info.Columns)+2)
	for _, c := range info.Columns {
		d := sqlgen.Ident(c.Name) + " " + c.Type
		if c.Collation != "" {
			d += " COLLATE " + c.Collation
		}
		defs = append(defs, d)
	}
	defs = append(defs, "_backfill_seq int NOT NULL", "_backfill_row bigint NOT NULL")
	_, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s);
		CREATE INDEX IF NOT EXISTS %s ON %s (_backfill_seq)`, table, strings.Join(defs, ", "),
		sqlgen.Ident(strings.Trim(table[strings.LastIndex(table, ".")+1:], `"`)+"_seq"), table))
	return err
}

// persistStager COPYs a chunk's rows into the run's staging table.
type persistStager struct {
	copy   *sql.Stmt
	buf    []any
	seq    int
	staged int64
	ended  bool // the COPY ended (EndStaging)
}

func newPersistStager(ctx context.Context, tx sqlx.ExtContext, table string, info backfilltype.TableInfo, seq int) (*persistStager, error) {
	p, ok := tx.(Preparer)
	if !ok {
		return nil, errNotTx
	}
	names := make([]string, len(info.Columns))
	for i, c := range info.Columns {
		names[i] = c.Name
	}
	stmt, err := p.PrepareContext(ctx, fmt.Sprintf(`COPY %s (%s, _backfill_seq, _backfill_row) FROM STDIN`, table, sqlgen.List("", names)))
	if err != nil {
		return nil, err
	}
	return &persistStager{copy: stmt, buf: make([]any, len(info.Columns)+2), seq: seq}, nil
}

func (s *persistStager) Add(ctx context.Context, row int64, values []any) error {
	n := copy(s.buf, values)
	s.buf[n], s.buf[n+1] = s.seq, row
	if _, err := s.copy.ExecContext(ctx, s.buf...); err != nil {
		return fmt.Errorf("backfill: stage row %d: %w", row, err)
	}
	s.staged++
	return nil
}

func (s *persistStager) Merge(ctx context.Context) (backfilltype.MergeResult, error) {
	if s.copy == nil && !s.ended {
		return backfilltype.MergeResult{}, backfilltype.ErrWriterClosed
	}
	return backfilltype.MergeResult{}, s.EndStaging(ctx)
}

// Staged implements [backfilldriver.PersistentStager].
func (s *persistStager) Staged() int64 { return s.staged }

func (s *persistStager) Close() error {
	if s.copy != nil {
		err := s.copy.Close()
		s.copy = nil
		return err
	}
	return nil
}
