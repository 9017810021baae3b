package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// PublishAtEnd stages every chunk into a persistent, logged staging table
// of the run (<manifest schema>.stage_<batch>), checkpointed per chunk
// (status staged), so a crash keeps what was staged; when no chunk is left
// to stage, one transaction checks every chunk's staged rows against the
// manifest, merges the chunks in order, runs [Job.Validators] on each and
// checkpoints them done. Readers see nothing of the run before that
// transaction commits, and all of it after. Needs [PGManifest] and
// [PGMerger].
const PublishAtEnd PublishMode = "at_end"

func stageTableName(pm *PGManifest, batchID int64) string {
	return sqlgen.Ident(pm.schema) + "." + sqlgen.Ident(fmt.Sprintf("stage_%d", batchID))
}

// createStageTable creates the run's persistent staging table once.
func createStageTable(ctx context.Context, db sqlx.ExtContext, table string, info TableInfo) error {
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
	ended  bool // the COPY ended (endStaging)
}

func newPersistStager(ctx context.Context, tx sqlx.ExtContext, table string, info TableInfo, seq int) (*persistStager, error) {
	p, ok := tx.(preparer)
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

func (s *persistStager) Merge(ctx context.Context) (MergeResult, error) {
	if s.copy == nil && !s.ended {
		return MergeResult{}, ErrWriterClosed
	}
	return MergeResult{}, s.endStaging(ctx)
}

func (s *persistStager) Close() error {
	if s.copy != nil {
		err := s.copy.Close()
		s.copy = nil
		return err
	}
	return nil
}

// fill loads the stager's temporary staging table from query (which must
// select the staged columns then _backfill_row), replacing what it held.
func (s *pgStager) fill(ctx context.Context, query string, args ...any) error {
	if err := s.endCopy(ctx); err != nil {
		return err
	}
	if _, err := s.tx.ExecContext(ctx, `TRUNCATE `+s.q.stage); err != nil {
		return err
	}
	names := make([]string, len(s.info.Columns))
	for i, c := range s.info.Columns {
		names[i] = c.Name
	}
	res, err := s.tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (%s, _backfill_row) %s`, s.q.stage, sqlgen.List("", names), query), args...)
	if err != nil {
		return err
	}
	s.staged, _ = res.RowsAffected()
	s.track = false // duplicates are found in SQL
	// One transaction merges every chunk: it locks the whole target once
	// rather than accumulate key locks.
	s.lockWhole = true
	return nil
}

// publishAtEnd merges every staged chunk of the run in one transaction.
// It returns the results of the chunks it completed.
func (ex *execution) publishAtEnd(ctx context.Context, pm *PGManifest) ([]ChunkResult, error) {
	r := ex.r
	stage := stageTableName(pm, ex.batchID)
	var done []ChunkResult
	err := inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		staged, err := pm.stagedChunks(ctx, tx, ex.batchID)
		if err != nil {
			return err
		}
		if len(staged) == 0 {
			return nil
		}
		var open int
		if err := sqlx.GetContext(ctx, tx, &open, pm.sql(`SELECT count(*) FROM {s}.chunks WHERE batch_id = $1 AND status NOT IN ('staged', 'done')`), ex.batchID); err != nil {
			return err
		}
		if open > 0 {
			return nil // other chunks are still to be staged
		}
		names := make([]string, len(ex.info.Columns))
		for i, c := range ex.info.Columns {
			names[i] = c.Name
		}
		for _, sc := range staged {
			c := ex.plan.Chunks[sc.Seq]
			started := time.Now()
			// Verified against the manifest: what a crash kept is what was
			// checkpointed.
			var n int64
			if err := sqlx.GetContext(ctx, tx, &n, `SELECT count(*) FROM `+stage+` WHERE _backfill_seq = $1`, sc.Seq); err != nil {
				return err
			}
			if n != sc.Staged {
				return fmt.Errorf("backfill: publish: chunk %s: %w: the staging table holds %d rows, the manifest %d", c.ID, ErrAccounting, n, sc.Staged)
			}
			info := ex.info
			info.Chunk = ChunkRef{BatchID: ex.batchID, Seq: sc.Seq, UndoTable: ex.undoTable, DeliveredTable: ex.deliveredTable,
				MaxRefused: r.cfg.MaxMergeRefusals}
			st, err := r.cfg.Merger.Stage(ctx, tx, info)
			if err != nil {
				return err
			}
			pst, ok := st.(*pgStager)
			if !ok {
				st.Close()
				return fmt.Errorf("backfill: publish: %w: PublishAtEnd needs PGMerger", ErrUnsupported)
			}
			if err := pst.fill(ctx, fmt.Sprintf(`SELECT %s, _backfill_row FROM %s WHERE _backfill_seq = $1`, sqlgen.List("", names), stage), sc.Seq); err != nil {
				st.Close()
				return err
			}
			mr, err := st.Merge(ctx)
			st.Close()
			if err != nil {
				return &ChunkError{Chunk: c, Attempt: 1, Err: err}
			}
			if err := tooManyRejects(r.cfg.MaxRejectsPerChunk, c, sc.Rejected, mr.Rejected); err != nil {
				return &ChunkError{Chunk: c, Attempt: 1, Err: err}
			}
			res := ChunkResult{Chunk: c, Attempt: 1, StartedAt: started, Worker: r.cfg.WorkerID,
				Counts: Counts{Read: sc.Read, Inserted: mr.Inserted, Updated: mr.Updated, Unchanged: mr.Unchanged,
					Rejected: sc.Rejected + int64(len(mr.Rejected)), Deduplicated: mr.Deduplicated}}
			if !res.Balanced() {
				return &ChunkError{Chunk: c, Attempt: 1, Err: fmt.Errorf("%w: %+v", ErrAccounting, res.Counts)}
			}
			if checks, err := ex.validate(ctx, tx, c, info, st, res.Counts); err != nil {
				var ge *gateError
				if errors.As(err, &ge) {
					// Kept outside the rolled back publish (Execution.publish).
					for _, e := range mr.Rejected {
						e.ChunkID = c.ID
						ge.exceptions = append(ge.exceptions, e)
					}
					return &ChunkError{Chunk: c, Attempt: 1, Err: ge}
				}
				return err
			} else if len(checks) > 0 {
				if err := pm.AddValidations(ctx, tx, ex.batchID, c.ID, checks); err != nil {
					return err
				}
			}
			res.FinishedAt = time.Now()
			ex2 := make([]Exception, len(mr.Rejected))
			for i, e := range mr.Rejected {
				e.BatchID, e.ChunkID = ex.batchID, c.ID
				ex2[i] = e
			}
			if err := pm.CompleteChunk(ctx, tx, ex.batchID, res, ex2); err != nil {
				return err
			}
			done = append(done, res)
		}
		_, err = tx.ExecContext(ctx, `DROP TABLE `+stage)
		return err
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}
