package backfill_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// rehearseJob is a job of 4 chunks of 10 ids into table (created with
// its undo log as the default rollback), naming its rows with version.
func rehearseJob(t *testing.T, db *sqlx.DB, table, version string, fail func(seq int) error) backfill.Job {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %q (id bigint PRIMARY KEY, name text, backfill_inserted_by bigint, backfill_updated_by bigint)`, table))
	require.NoError(t, err)
	return rehearseJobOf(table, version, fail)
}

// rehearseJobOf is rehearseJob's job, its table already created.
func rehearseJobOf(table, version string, fail func(seq int) error) backfill.Job {
	return backfill.Job{
		Name:        table,
		CodeVersion: version,
		Chunker:     backfill.IntRange(0, 40, 10),
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if fail != nil {
				if err := fail(c.Seq); err != nil {
					return err
				}
			}
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, fmt.Sprintf("%s-%d", version, id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "name"}},
	}
}

// manifestState is what a rehearsal must leave as it found: the target's
// checksum (md5 of its ordered rows) and the manifest's runs, chunks,
// undo log, exceptions and validations.
func manifestState(t *testing.T, db *sqlx.DB, table string) string {
	t.Helper()
	var s string
	require.NoError(t, db.Get(&s, fmt.Sprintf(`SELECT concat_ws(' | ',
		(SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t.id)), '') FROM %q t),
		(SELECT string_agg(concat_ws(':', batch_id, status), ',' ORDER BY batch_id) FROM backfill.runs),
		(SELECT string_agg(concat_ws(':', batch_id, seq, status, attempts, rows_read, rows_inserted, rows_updated, rows_unchanged, lease_key, lease_epoch, checkpointed_at),
			',' ORDER BY batch_id, seq) FROM backfill.chunks),
		(SELECT count(*) FROM backfill.undo), (SELECT count(*) FROM backfill.exceptions), (SELECT count(*) FROM backfill.validations))`, table)))
	return s
}

// TestRehearseRollsBack rehearses a restatement of a completed run: each
// rehearsed chunk merges (updates every row, with its undo images) and
// is measured inside its transaction, which rolls back: the target's
// checksum and the manifest's runs and chunks are as before, and only
// the rehearsal's row is added.
func TestRehearseRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	_, err = r.Run(ctx, rehearseJob(t, db, "rehearsed", "v1", nil))
	require.NoError(t, err)
	before := manifestState(t, db, "rehearsed")

	job := rehearseJob(t, db, "rehearsed", "v2", nil)
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.NoError(t, err)
	require.Equal(t, before, manifestState(t, db, "rehearsed"), "a rehearsal changes neither the target nor the manifest's runs and chunks")

	require.NotZero(t, rh.ID)
	require.Equal(t, 4, rh.ChunksTotal)
	seqs := []int{}
	for _, c := range rh.Chunks {
		seqs = append(seqs, c.Chunk.Seq)
		require.Equal(t, backfill.Counts{Read: 10, Updated: 10}, c.Counts, "chunk %d", c.Chunk.Seq)
		require.Positive(t, c.WALBytes, "chunk %d: WAL of its merge", c.Chunk.Seq)
		require.Positive(t, c.Phases.Merge, "chunk %d", c.Chunk.Seq)
		require.Equal(t, c.Phases.Total(), c.Duration)
		require.Positive(t, c.ConcurrentDuration, "chunk %d: timed again beside another (Concurrency 2)", c.Chunk.Seq)
		require.Equal(t, c.Concurrent.Total(), c.ConcurrentDuration)
		require.Positive(t, c.HeapBytes)
		require.Equal(t, int64(-1), c.EstimatedRows)
		locked := false
		for _, l := range c.Locks {
			if l.LockType == "relation" && l.Relation == "rehearsed" && l.Mode == "RowExclusiveLock" {
				locked = true
			}
		}
		require.True(t, locked, "chunk %d: locks %+v", c.Chunk.Seq, c.Locks)
	}
	require.Equal(t, []int{0, 2, 3}, seqs, "first, middle and last without estimates")
	f := rh.Forecast
	require.Equal(t, "chunks", f.Basis)
	require.Equal(t, 4, f.Chunks)
	require.Equal(t, int64(40), f.Rows)
	require.Equal(t, 2, f.Concurrency)
	require.Positive(t, f.WALBytes)
	require.Less(t, f.DurationLow, f.DurationHigh)

	// Recorded.
	recorded, err := backfill.NewPGManifest("").Rehearsals(ctx, db, job.Name, 0)
	require.NoError(t, err)
	require.Len(t, recorded, 1)
	require.Equal(t, rh.ID, recorded[0].ID)
	require.Equal(t, rh.Forecast, recorded[0].Forecast)
	require.Len(t, recorded[0].Chunks, 3)
	require.Equal(t, rh.Chunks[1].WALBytes, recorded[0].Chunks[1].WALBytes)

	// A Run of the same plan after it loads what the rehearsal rehearsed.
	job.NewRun = true
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(40), rep.Counts.Updated)
}

// TestRehearseChunksAndEstimates rehearses the chunks named (by Seq and
// by ID), and the smallest, median and largest by estimate, on a job that
// never ran: none of its runs exists after.
func TestRehearseChunksAndEstimates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := rehearseJob(t, db, "named", "v1", nil)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	before := manifestState(t, db, "named")

	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{Chunks: []string{"3", "int:10/20"}, NoRecord: true})
	require.NoError(t, err)
	require.Zero(t, rh.ID, "not recorded")
	require.Len(t, rh.Chunks, 2)
	require.Equal(t, 3, rh.Chunks[0].Chunk.Seq)
	require.Equal(t, 1, rh.Chunks[1].Chunk.Seq)
	require.Equal(t, backfill.Counts{Read: 10, Inserted: 10}, rh.Chunks[0].Counts)
	// The first rows of the empty target, its index and the staging
	// table took pages (left empty by the rollback: later chunks reuse
	// them).
	require.Positive(t, rh.Chunks[0].TargetBytes)
	require.Positive(t, rh.Chunks[0].IndexBytes)
	require.Positive(t, rh.Chunks[0].TempBytes)

	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{Chunks: []string{"7"}})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	est := map[int]int64{0: 50, 1: 10, 2: 30, 3: 20}
	rh, err = r.Rehearse(ctx, job, backfill.RehearseOptions{
		Estimate: func(_ context.Context, c backfill.Chunk) (int64, error) { return est[c.Seq], nil },
		NoRecord: true})
	require.NoError(t, err)
	seqs := []int{}
	for _, c := range rh.Chunks {
		seqs = append(seqs, c.Chunk.Seq)
		require.Equal(t, est[c.Chunk.Seq], c.EstimatedRows)
	}
	require.Equal(t, []int{0, 1, 2}, seqs, "smallest (1), median (the upper of two: 2), largest (0) by estimate, in plan order")
	require.Equal(t, "rows", rh.Forecast.Basis)
	require.Equal(t, before, manifestState(t, db, "named"))

	// WarmExtract: each chunk extracted twice, loaded once.
	calls := 0
	warm := job
	warm.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		calls++
		return job.Extractor.Extract(ctx, c, w)
	})
	rh, err = r.Rehearse(ctx, warm, backfill.RehearseOptions{Chunks: []string{"0"}, WarmExtract: true, NoRecord: true})
	require.NoError(t, err)
	require.Equal(t, 2, calls)
	require.Equal(t, backfill.Counts{Read: 10, Inserted: 10}, rh.Chunks[0].Counts)
	require.True(t, rh.Forecast.WarmExtract)
	var runs int
	require.NoError(t, db.Get(&runs, `SELECT count(*) FROM backfill.runs`))
	require.Zero(t, runs)
}

// TestRehearseChunkFails: an extractor's error during a rehearsal ends
// it with an error naming the chunk, and records nothing.
func TestRehearseChunkFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := rehearseJob(t, db, "failing", "v1", func(seq int) error {
		if seq == 2 {
			return errors.New("source unreachable")
		}
		return nil
	})
	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{})
	var ce *backfill.ChunkError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, 2, ce.Chunk.Seq)
	require.Contains(t, err.Error(), "int:20/30")
	require.Contains(t, err.Error(), "source unreachable")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.rehearsals`))
	require.Zero(t, n)
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM failing`))
	require.Zero(t, n)
}

// TestRehearseTargetLocked: a rehearsal whose target another session
// holds locked (LOCK TABLE, a DDL) waits for it no longer than
// Config.LockTimeout, as a run's chunk does, and fails naming the lock
// timeout and the session that holds the lock; nothing is recorded.
func TestRehearseTargetLocked(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r, err := backfill.New(db, &backfill.Config{LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	job := rehearseJob(t, db, "locked", "v1", nil)
	// Held until the rehearsal returned: a rehearsal that waited for it
	// would end only at the context's deadline.
	holder, err := db.Conn(t.Context())
	require.NoError(t, err)
	defer holder.Close()
	_, err = holder.ExecContext(t.Context(), `SET application_name = 'lock holder'`)
	require.NoError(t, err)
	_, err = holder.ExecContext(t.Context(), `BEGIN; LOCK TABLE locked IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	defer func() { _, _ = holder.ExecContext(context.Background(), `ROLLBACK`) }()

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the wait is bounded by LockTimeout")
	var ce *backfill.ChunkError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, err.Error(), "lock timeout")
	require.Contains(t, err.Error(), "lock holder", "the session holding the lock is named")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.rehearsals`))
	require.Zero(t, n)
}

// TestRehearseActiveRun: a job whose run is running or paused is
// refused; once the run is cancelled, it is rehearsed.
func TestRehearseActiveRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := rehearseJob(t, db, "active", "v1", nil)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	pr, err := r.StartRunTx(ctx, tx, job)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.ErrorIs(t, err, backfill.ErrRunStatus)
	require.Contains(t, err.Error(), "running")
	require.NoError(t, r.Pause(ctx, pr.BatchID, "test", "rehearse"))
	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.ErrorIs(t, err, backfill.ErrRunStatus)
	require.Contains(t, err.Error(), "paused")

	require.NoError(t, r.Cancel(ctx, pr.BatchID, "test", "rehearse instead"))
	before := manifestState(t, db, "active")
	_, err = r.Rehearse(ctx, job, backfill.RehearseOptions{Sample: 1})
	require.NoError(t, err)
	require.Equal(t, before, manifestState(t, db, "active"))
}

// TestStatusForecast: after a run, Status compares it with the forecast
// of the rehearsal before it; a run of another plan has none.
func TestStatusForecast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := rehearseJob(t, db, "forecast", "v1", nil)
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.NoError(t, err)
	_, err = r.Run(ctx, job)
	require.NoError(t, err)

	s, err := r.Status(ctx, job)
	require.NoError(t, err)
	require.NotNil(t, s.Forecast)
	require.Equal(t, rh.ID, s.Forecast.RehearsalID)
	require.Equal(t, rh.Forecast, s.Forecast.Forecast)
	require.Equal(t, int64(40), s.Forecast.Rows)
	require.Equal(t, int64(40), s.Forecast.Forecast.Rows)
	require.True(t, s.Forecast.Done)
	require.Positive(t, s.Forecast.Duration)
	require.Contains(t, s.String(), fmt.Sprintf("forecast: rehearsal %d", rh.ID))

	other := rehearseJob(t, db, "forecast", "v2", nil)
	other.NewRun = true
	_, err = r.Run(ctx, other)
	require.NoError(t, err)
	s, err = r.Status(ctx, other)
	require.NoError(t, err)
	require.Nil(t, s.Forecast, "no rehearsal of this plan")
	require.False(t, strings.Contains(s.String(), "forecast:"))
}

// TestRehearseLeastPrivilege: the loader's grants (those of
// backfill grants, after an administrator's migration) suffice to
// rehearse: the WAL, sizes and locks it reads need no more.
func TestRehearseLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE TABLE least (id bigint PRIMARY KEY, name text, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	m := backfill.NewPGManifest("")
	require.NoError(t, m.Init(ctx, r.admin))
	for _, g := range m.Grants(dbName(t, r.admin), r.name) {
		r.exec(t, g)
	}
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON least TO {role}`)
	runner, err := backfill.New(r.db, nil)
	require.NoError(t, err)
	rh, err := runner.Rehearse(ctx, rehearseJob(t, r.admin, "least", "v1", nil), backfill.RehearseOptions{})
	require.NoError(t, err)
	require.Len(t, rh.Chunks, 3)
	require.Positive(t, rh.Chunks[0].WALBytes)
	require.NotZero(t, rh.ID)
}

// rehearseKillJob is the job the child of TestRehearseKilled rehearses
// into table killed: a validator sleeps inside each chunk's transaction,
// holding it open.
func rehearseKillJob() backfill.Job {
	job := rehearseJobOf("killed", "v1", nil)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
		time.Sleep(300 * time.Millisecond)
		return backfill.CheckResult{Check: "slow", Severity: backfill.SeverityWarn, Passed: true}, nil
	})}
	return job
}

func init() {
	childProcess("BACKFILL_REHEARSE_CHILD", func(db *sqlx.DB) error {
		r, err := backfill.New(db, nil)
		if err != nil {
			return err
		}
		_, err = r.Rehearse(context.Background(), rehearseKillJob(), backfill.RehearseOptions{Sample: 4})
		return err
	})
}

// TestRehearseKilled: a rehearsal killed (SIGKILL) inside a chunk's
// transaction leaves the target and the manifest as they were, records
// no rehearsal, and holds nothing: a run of the job then works.
func TestRehearseKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	t.Cleanup(func() { _ = db.Close() })
	job := rehearseJob(t, db, "killed", "v1", nil)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	before := manifestState(t, db, "killed")
	// The rehearsal's chunk transaction holds the job's lock, shared.
	killChildWhen(t, db, "BACKFILL_REHEARSE_CHILD", url, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ShareLock' AND granted`, 1)
	require.Equal(t, before, manifestState(t, db, "killed"))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.rehearsals`))
	require.Zero(t, n)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, int64(40), rep.Counts.Inserted)
}

// TestRehearseWithChunkTarget: a Runner with Config.ChunkTarget rehearses
// its chunks whole (their sub-chunks would be checkpointed under a lease
// a rehearsal does not take), and the target is left as it was.
func TestRehearseWithChunkTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, &backfill.Config{ChunkTarget: time.Millisecond, ChunkMaxRows: 2})
	require.NoError(t, err)
	job := rehearseJob(t, db, "adaptive", "v1", nil)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, db))
	before := manifestState(t, db, "adaptive")
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{Sample: 2, NoRecord: true})
	require.NoError(t, err)
	require.NotEmpty(t, rh.Chunks)
	require.Equal(t, before, manifestState(t, db, "adaptive"))
}

// TestBlueprintShowsRehearsal: the blueprint of a plan that was rehearsed
// carries the latest rehearsal's forecast; another plan's carries none.
func TestBlueprintShowsRehearsal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, nil)
	require.NoError(t, err)
	job := rehearseJob(t, db, "planned", "v1", nil)
	bp, err := r.Blueprint(ctx, job)
	require.NoError(t, err)
	require.Nil(t, bp.Rehearsal)
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{Sample: 2})
	require.NoError(t, err)
	bp, err = r.Blueprint(ctx, job)
	require.NoError(t, err)
	require.NotNil(t, bp.Rehearsal, "the plan's rehearsal")
	require.Equal(t, fmt.Sprint(rh.ID), bp.Rehearsal.ID)
	require.Equal(t, rh.Forecast.Rows, bp.Rehearsal.Rows)
	require.Regexp(t, `rehearsal: +`+fmt.Sprint(rh.ID)+`: rehearsed `, bp.Text())
	job.CodeVersion = "v2"
	bp, err = r.Blueprint(ctx, job)
	require.NoError(t, err)
	require.Nil(t, bp.Rehearsal, "another plan's blueprint has none")
}

// TestRunRecordsWAL: a run records, in the transactions that create it,
// checkpoint each chunk and complete it, the server's WAL position and
// its target's sizes; a chunk whose transaction rolled back (a validator
// failed after its merge) records nothing. Status compares them with
// the rehearsal's forecast: the WAL to the latest checkpoint while the
// run is not completed, the growth once it is.
func TestRunRecordsWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
	require.NoError(t, err)
	job := rehearseJob(t, db, "walled", "v1", nil)
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{})
	require.NoError(t, err)
	require.Positive(t, rh.Forecast.CommitTime)
	require.Positive(t, rh.Forecast.Overhead)
	require.Contains(t, rh.Forecast.Durability, "synchronous_commit=")
	// The rehearsal's rolled back rows leave pages: VACUUM gives them back,
	// for the run's growth to start from an empty table.
	db.MustExec(`VACUUM walled`)

	var failing atomic.Bool
	failing.Store(true)
	job.Validators = []backfill.Validator{backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
		if s.Chunk.Seq == 3 && failing.Load() {
			return backfill.CheckResult{}, errors.New("checker unreachable")
		}
		return backfill.CheckResult{Check: "ok", Severity: backfill.SeverityWarn, Passed: true}, nil
	})}
	var lsn0 string
	require.NoError(t, db.Get(&lsn0, `SELECT pg_current_wal_insert_lsn()::text`))
	rep, err := r.Run(ctx, job)
	require.Error(t, err, "chunk 3's validator fails")

	type chunkWAL struct {
		Seq    int            `db:"seq"`
		Status string         `db:"status"`
		LSN    sql.NullString `db:"wal_lsn"`
	}
	var chunks []chunkWAL
	require.NoError(t, db.Select(&chunks, `SELECT seq, status, wal_lsn::text FROM backfill.chunks WHERE batch_id = $1 ORDER BY seq`, rep.BatchID))
	require.Len(t, chunks, 4)
	for _, c := range chunks {
		require.Equal(t, c.Status == "done", c.LSN.Valid, "chunk %d (%s): its WAL position is recorded with its checkpoint only", c.Seq, c.Status)
	}
	require.Equal(t, "failed", chunks[3].Status)
	var run struct {
		Start       sql.NullString `db:"wal_start"`
		End         sql.NullString `db:"wal_end"`
		TargetStart sql.NullInt64  `db:"target_start_bytes"`
		TargetEnd   sql.NullInt64  `db:"target_end_bytes"`
		IndexEnd    sql.NullInt64  `db:"index_end_bytes"`
		Started     int64          `db:"started"`
	}
	const runQuery = `SELECT wal_start::text, wal_end::text, target_start_bytes, target_end_bytes, index_end_bytes,
		pg_wal_lsn_diff(wal_start, $2::pg_lsn)::bigint AS started FROM backfill.runs WHERE batch_id = $1`
	require.NoError(t, db.Get(&run, runQuery, rep.BatchID, lsn0))
	require.True(t, run.Start.Valid, "the run's creation records its WAL position")
	require.GreaterOrEqual(t, run.Started, int64(0), "recorded by the run's creation")
	require.True(t, run.TargetStart.Valid, "the run's creation records its target's size")
	require.False(t, run.End.Valid || run.TargetEnd.Valid, "not completed: no end recorded")

	s, err := r.Status(ctx, job)
	require.NoError(t, err)
	require.NotNil(t, s.Forecast)
	require.False(t, s.Forecast.Done)
	require.Positive(t, s.Forecast.WALBytes, "WAL to the latest checkpoint")
	require.Equal(t, int64(-1), s.Forecast.TargetBytes, "growth: not before the run completed")

	// The run resumed completes: its end and its growth are recorded.
	failing.Store(false)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	var lsn1 string
	require.NoError(t, db.Get(&lsn1, `SELECT pg_current_wal_insert_lsn()::text`))
	require.NoError(t, db.Get(&run, runQuery, rep.BatchID, lsn0))
	require.True(t, run.End.Valid)
	require.True(t, run.TargetEnd.Valid && run.IndexEnd.Valid)
	require.Greater(t, run.TargetEnd.Int64, run.TargetStart.Int64, "40 rows loaded into a table vacuumed empty")
	var latest string
	require.NoError(t, db.Get(&latest, `SELECT max(wal_lsn)::text FROM backfill.chunks WHERE batch_id = $1`, rep.BatchID))
	var order []bool
	require.NoError(t, db.Select(&order, `SELECT x FROM unnest(ARRAY[$1::pg_lsn <= $2::pg_lsn, $2::pg_lsn <= $3::pg_lsn, $3::pg_lsn <= $4::pg_lsn]) x`,
		run.Start.String, latest, run.End.String, lsn1))
	require.Equal(t, []bool{true, true, true}, order, "start %s <= latest checkpoint %s <= end %s <= after the run %s", run.Start.String, latest, run.End.String, lsn1)

	s, err = r.Status(ctx, job)
	require.NoError(t, err)
	f := s.Forecast
	require.NotNil(t, f)
	require.True(t, f.Done)
	var outside int64
	require.NoError(t, db.Get(&outside, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, lsn1, lsn0))
	require.Positive(t, f.WALBytes)
	require.LessOrEqual(t, f.WALBytes, outside, "the run's WAL is within the WAL around it")
	require.Equal(t, run.TargetEnd.Int64-run.TargetStart.Int64, f.TargetBytes)
	require.GreaterOrEqual(t, f.IndexBytes, int64(0))
	require.Contains(t, s.String(), fmt.Sprintf("WAL %d B (forecast %d B", f.WALBytes, rh.Forecast.WALBytes))
	require.Contains(t, s.String(), fmt.Sprintf("table +%d B (forecast +%d B", f.TargetBytes, rh.Forecast.TargetBytes))
}
