package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
// transaction commits, and all of it after. Needs a manifest with
// [ManifestStaging] and a merger with [MergerStaging] ([PGManifest] and
// [PGMerger], or backfilltest's fakes).
const PublishAtEnd PublishMode = "at_end"

// publishEnd is the publisher of [PublishAtEnd]: chunks are staged into
// the run's persistent staging table, and the run's last call merges them
// all in one transaction (finish).
type publishEnd struct{}

var (
	_ MergerStaging   = (*PGMerger)(nil)
	_ StagingIsolator = (*PGMerger)(nil)
	_ UndoLogWriter   = (*PGMerger)(nil)
)

func (publishEnd) requires(c capabilities) error {
	return errors.Join(need(c.staging != nil, "ManifestStaging", "PublishAtEnd checkpoints staged chunks in the manifest"),
		need(c.mergeStage != nil, "MergerStaging", "PublishAtEnd stages into the run's persistent staging table"))
}

func (publishEnd) rereads() bool { return false }

func (publishEnd) switchesBack() bool { return false }

func (publishEnd) publishesOpen() bool { return true }

func (publishEnd) prepare(ctx context.Context, ex *execution) error {
	if err := ex.r.caps.mergeStage.CreateStaging(ctx, ex.r.db, ex.r.caps.staging.StagingTable(ex.batchID), ex.info); err != nil {
		return fmt.Errorf("backfill: job %q: staging table: %w", ex.job.Name, err)
	}
	return nil
}

func (publishEnd) target(ctx context.Context, ex *execution, tx Tx, c Chunk) (chunkTarget, error) {
	info := ex.info
	info.Chunk = ChunkRef{BatchID: ex.batchID, Seq: c.Seq}
	t := chunkTarget{info: info, deferred: true, isolate: ex.r.caps.isolates && ex.r.cfg.MaxStagingRejects > 0}
	var ps PersistentStager
	t.newStager = func() (Stager, error) {
		st, err := ex.r.caps.mergeStage.StagePersistent(ctx, tx, ex.r.caps.staging.StagingTable(ex.batchID), ex.info, c.Seq)
		ps = st
		return st, err
	}
	t.staged = func() int64 { return ps.Staged() }
	return t, nil
}

// beforeCommit checkpoints the chunk as staged.
func (publishEnd) beforeCommit(ctx context.Context, ex *execution, tx Tx, t chunkTarget, res ChunkResult, exceptions []Exception) error {
	return ex.r.caps.staging.StageChunk(ctx, tx, StageChunkParams{
		BatchID: ex.batchID, Chunk: res.Chunk, Read: res.Read, Rejected: res.Rejected, Staged: t.staged(), Exceptions: exceptions,
	})
}

func (publishEnd) finish(ctx context.Context, ex *execution) { ex.publish(ctx) }

func (publishEnd) published(context.Context, *execution, Run) (bool, error) { return false, nil }

func (publishEnd) rollback(context.Context, *Runner, Job, Run, Plan, RollbackOptions) (RollbackReport, bool, error) {
	return RollbackReport{}, false, nil
}

// CreateStaging implements [MergerStaging.CreateStaging].
// The DDL runs in a READ COMMITTED transaction of its own (inTx), not
// under the server's default isolation outside any transaction, after a
// transaction-level advisory lock on the table's name: workers starting
// at once would otherwise race in CREATE TABLE IF NOT EXISTS, which two
// sessions can both pass and then collide on the catalog's unique index
// (23505 on pg_type).
func (m *PGMerger) CreateStaging(ctx context.Context, db sqlx.ExtContext, table string, info TableInfo) error {
	return inTx(ctx, db, func(tx sqlx.ExtContext) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('backfill.stage:' || $1, 0))`, table); err != nil {
			return err
		}
		return createStageTable(ctx, tx, table, info)
	})
}

// StagePersistent implements [MergerStaging.StagePersistent] with COPY.
func (m *PGMerger) StagePersistent(ctx context.Context, tx sqlx.ExtContext, table string, info TableInfo, seq int) (PersistentStager, error) {
	return newPersistStager(ctx, tx, table, info, seq)
}

// StageFrom implements [MergerStaging.StageFrom].
func (m *PGMerger) StageFrom(ctx context.Context, tx sqlx.ExtContext, info TableInfo, table string, seq int, rows int64) (Stager, error) {
	st, err := m.Stage(ctx, tx, info)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(info.Columns))
	for i, c := range info.Columns {
		names[i] = c.Name
	}
	if err := st.(*pgStager).fill(ctx, fmt.Sprintf(`SELECT %s, _backfill_row FROM %s WHERE _backfill_seq = $1`, sqlgen.List("", names), table), seq); err != nil {
		st.Close()
		return nil, err
	}
	if n := st.(*pgStager).staged; n != rows {
		st.Close()
		return nil, fmt.Errorf("%w: the staging table holds %d rows, the manifest %d", ErrAccounting, n, rows)
	}
	return st, nil
}

// DropStaging implements [MergerStaging.DropStaging].
func (m *PGMerger) DropStaging(ctx context.Context, tx sqlx.ExtContext, table string) error {
	_, err := tx.ExecContext(ctx, `DROP TABLE `+table)
	return err
}

// IsolatesRefusedValues implements [StagingIsolator]: its stagers COPY
// in the chunk's transaction.
func (m *PGMerger) IsolatesRefusedValues() bool { return true }

// WritesUndoLog implements [UndoLogWriter].
func (m *PGMerger) WritesUndoLog() bool { return true }

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

// Staged implements [PersistentStager].
func (s *persistStager) Staged() int64 { return s.staged }

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
func (ex *execution) publishAtEnd(ctx context.Context) ([]ChunkResult, error) {
	r := ex.r
	stage := r.caps.staging.StagingTable(ex.batchID)
	var done []ChunkResult
	err := inBoundedTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		done = done[:0] // inTx may run this again after a conflict
		staged, err := r.caps.staging.StagedChunks(ctx, tx, ex.batchID)
		if err != nil || len(staged) == 0 {
			return err
		}
		states, err := r.cfg.Manifest.Chunks(ctx, tx, ex.batchID)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(states, func(s ChunkState) bool { return s.Status != chunkStaged && s.Status != ChunkDone }) {
			return nil // other chunks are still to be staged
		}
		for _, sc := range staged {
			i, found := slices.BinarySearchFunc(states, sc.Seq, func(s ChunkState, seq int) int { return s.Chunk.Seq - seq })
			var c Chunk
			ok := found
			if found {
				c, ok = ex.plan.chunkOf(states[i].Chunk)
			}
			if !ok {
				return fmt.Errorf("backfill: publish: staged chunk %d is not in the plan", sc.Seq)
			}
			res, err := ex.publishStaged(ctx, tx, stage, c, sc)
			if err != nil {
				return err
			}
			done = append(done, res)
		}
		return r.caps.mergeStage.DropStaging(ctx, tx, stage)
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// chunkStaged is the status of a chunk staged for the publish at the end
// ([ManifestStaging.StageChunk]).
const chunkStaged ChunkStatus = "staged"

// publishStaged merges, validates and completes staged chunk sc (the
// plan's chunk c) in the publish's transaction tx.
func (ex *execution) publishStaged(ctx context.Context, tx sqlx.ExtContext, stage string, c Chunk, sc StagedChunk) (ChunkResult, error) {
	r := ex.r
	started := time.Now()
	info := ex.chunkInfo(ex.info, c)
	// Verified against the manifest: what a crash kept is what was
	// checkpointed.
	st, err := r.caps.mergeStage.StageFrom(ctx, tx, info, stage, sc.Seq, sc.Staged)
	if errors.Is(err, ErrAccounting) {
		return ChunkResult{}, fmt.Errorf("backfill: publish: chunk %s: %w", c.ID, err)
	}
	if err != nil {
		return ChunkResult{}, err
	}
	defer st.Close()
	mr, err := st.Merge(ctx)
	if err != nil {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: err}
	}
	if err := tooManyRejects(r.cfg.MaxRejectsPerChunk, c, sc.Rejected, mr.Rejected); err != nil {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: err}
	}
	res := ChunkResult{Chunk: c, Attempt: 1, StartedAt: started, Worker: r.cfg.WorkerID,
		Counts: Counts{Read: sc.Read, Inserted: mr.Inserted, Updated: mr.Updated, Unchanged: mr.Unchanged,
			Rejected: sc.Rejected + int64(len(mr.Rejected)), Deduplicated: mr.Deduplicated}}
	if !res.Balanced() {
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: fmt.Errorf("%w: %+v", ErrAccounting, res.Counts)}
	}
	checks, err := ex.validate(ctx, tx, c, info, st, res.Counts)
	var ge *gateError
	if errors.As(err, &ge) {
		// Kept outside the rolled back publish (execution.publish).
		for _, e := range mr.Rejected {
			e.ChunkID = c.ID
			ge.exceptions = append(ge.exceptions, e)
		}
		return ChunkResult{}, &ChunkError{Chunk: c, Attempt: 1, Err: ge}
	}
	if err != nil {
		return ChunkResult{}, err
	}
	if len(checks) > 0 {
		if err := r.caps.validations.AddValidations(ctx, tx, ex.batchID, c.ID, checks); err != nil {
			return ChunkResult{}, err
		}
	}
	res.FinishedAt = time.Now()
	exceptions := make([]Exception, len(mr.Rejected))
	for i, e := range mr.Rejected {
		e.BatchID, e.ChunkID = ex.batchID, c.ID
		exceptions[i] = e
	}
	if err := r.cfg.Manifest.CompleteChunk(ctx, tx, ex.batchID, res, exceptions); err != nil {
		return ChunkResult{}, err
	}
	return res, nil
}
