package backfill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// rollupDiff compares the manifest's rollups (chunk_counts,
// exception_counts, summed by group) with a recount of the chunks and
// queued exceptions of every run, and returns the groups that differ
// (none when they agree).
func rollupDiff(t interface {
	require.TestingT
	Helper()
}, db sqlx.QueryerContext, schema string) []string {
	t.Helper()
	var diff []string
	q := strings.ReplaceAll(`WITH rc AS (
		SELECT batch_id, status, skipped,
			coalesce(CASE kind WHEN 'time' THEN extract(epoch FROM end_at - start_at) WHEN 'int' THEN (hi - lo)::numeric END > 0, false) AS has_span,
			count(*)::bigint AS chunks, sum(rows_read)::bigint AS rd, sum(rows_inserted)::bigint AS ins, sum(rows_updated)::bigint AS upd,
			sum(rows_unchanged)::bigint AS unch, sum(rows_rejected)::bigint AS rej, sum(rows_deduplicated)::bigint AS dedup,
			sum(rows_processed)::bigint AS processed, sum(reads)::bigint AS reads,
			coalesce(sum(CASE kind WHEN 'time' THEN extract(epoch FROM end_at - start_at) WHEN 'int' THEN (hi - lo)::numeric END), 0) AS span
		FROM {s}.chunks GROUP BY 1, 2, 3, 4),
	ro AS (
		SELECT batch_id, status, skipped, has_span, sum(chunks)::bigint AS chunks, sum(rows_read)::bigint AS rd,
			sum(rows_inserted)::bigint AS ins, sum(rows_updated)::bigint AS upd, sum(rows_unchanged)::bigint AS unch,
			sum(rows_rejected)::bigint AS rej, sum(rows_deduplicated)::bigint AS dedup, sum(rows_processed)::bigint AS processed,
			sum(reads)::bigint AS reads, sum(span) AS span
		FROM {s}.chunk_counts GROUP BY 1, 2, 3, 4
		HAVING sum(chunks) <> 0 OR sum(rows_read) <> 0 OR sum(rows_processed) <> 0 OR sum(reads) <> 0 OR sum(span) <> 0),
	ec AS (SELECT batch_id, reason, column_name, count(*)::bigint AS n FROM {s}.exceptions WHERE failed_attempt IS NULL GROUP BY 1, 2, 3),
	eo AS (SELECT batch_id, reason, column_name, sum(n)::bigint AS n FROM {s}.exception_counts GROUP BY 1, 2, 3 HAVING sum(n) <> 0)
	SELECT 'recount ' || x::text FROM (SELECT * FROM rc EXCEPT SELECT * FROM ro) x
	UNION ALL SELECT 'rollup ' || x::text FROM (SELECT * FROM ro EXCEPT SELECT * FROM rc) x
	UNION ALL SELECT 'exceptions recount ' || x::text FROM (SELECT * FROM ec EXCEPT SELECT * FROM eo) x
	UNION ALL SELECT 'exceptions rollup ' || x::text FROM (SELECT * FROM eo EXCEPT SELECT * FROM ec) x`, "{s}", schema)
	require.NoError(t, sqlx.SelectContext(context.Background(), db, &diff, q))
	return diff
}

// requireStatusIsRecount checks run batch's Status, its run_progress row
// and JobChunks against a recount of its chunks and exceptions.
func requireStatusIsRecount(t *testing.T, db *sqlx.DB, batch int64) {
	t.Helper()
	ctx := context.Background()
	require.Empty(t, rollupDiff(t, db, "backfill"))
	pm := NewPGManifest("")
	st, err := pm.Status(ctx, db, batch)
	require.NoError(t, err)
	var rc struct {
		Total, Done, Open, Pending, Failed, Skipped, Leased                   int
		Read, Inserted, Updated, Unchanged, Rejected, Dedup, Processed, Reads int64
	}
	require.NoError(t, db.QueryRowx(`SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'open'),
		count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed'),
		count(*) FILTER (WHERE skipped AND status IN ('done', 'open')), count(*) FILTER (WHERE lease_key IS NOT NULL AND status IN ('pending', 'open')),
		coalesce(sum(rows_read) FILTER (WHERE status IN ('done', 'open')), 0), coalesce(sum(rows_inserted) FILTER (WHERE status IN ('done', 'open')), 0),
		coalesce(sum(rows_updated) FILTER (WHERE status IN ('done', 'open')), 0), coalesce(sum(rows_unchanged) FILTER (WHERE status IN ('done', 'open')), 0),
		coalesce(sum(rows_rejected) FILTER (WHERE status IN ('done', 'open')), 0), coalesce(sum(rows_deduplicated) FILTER (WHERE status IN ('done', 'open')), 0),
		coalesce(sum(rows_processed), 0), coalesce(sum(reads), 0)
		FROM backfill.chunks WHERE batch_id = $1`, batch).Scan(&rc.Total, &rc.Done, &rc.Open, &rc.Pending, &rc.Failed, &rc.Skipped, &rc.Leased,
		&rc.Read, &rc.Inserted, &rc.Updated, &rc.Unchanged, &rc.Rejected, &rc.Dedup, &rc.Processed, &rc.Reads))
	require.Equal(t, []int{rc.Total, rc.Done, rc.Open, rc.Pending, rc.Failed, rc.Skipped, rc.Leased},
		[]int{st.Chunks.Total, st.Chunks.Done, st.Chunks.Open, st.Chunks.Pending, st.Chunks.Failed, st.Chunks.Skipped, st.Chunks.InFlight})
	require.Equal(t, []int64{rc.Read, rc.Inserted, rc.Updated, rc.Unchanged, rc.Rejected, rc.Dedup, rc.Processed, rc.Reads},
		[]int64{st.Rows.Read, st.Rows.Inserted, st.Rows.Updated, st.Rows.Unchanged, st.Rows.Rejected, st.Rows.Deduplicated, st.RowsProcessed, st.ChunkReads})
	var ex []string
	require.NoError(t, db.Select(&ex, `SELECT reason || '/' || column_name || '=' || count(*) FROM backfill.exceptions
		WHERE batch_id = $1 AND failed_attempt IS NULL GROUP BY reason, column_name ORDER BY count(*) DESC, reason, column_name`, batch))
	got := []string{}
	for _, e := range st.Exceptions {
		got = append(got, fmt.Sprintf("%s/%s=%d", e.Reason, e.Column, e.Count))
	}
	require.Equal(t, append([]string{}, ex...), got)
	// The view operators read gives the same numbers.
	var view struct {
		Done int   `db:"chunks_done"`
		Read int64 `db:"rows_read"`
		Proc int64 `db:"rows_processed"`
		Skip int   `db:"chunks_skipped"`
	}
	require.NoError(t, db.Get(&view, `SELECT chunks_done, rows_read, rows_processed, chunks_skipped FROM backfill.run_progress WHERE batch_id = $1`, batch))
	require.Equal(t, []int64{int64(rc.Done), rc.Read, rc.Processed, int64(rc.Skipped)}, []int64{int64(view.Done), view.Read, view.Proc, int64(view.Skip)})
	// JobChunks (the Prometheus scrape) counts the latest run's chunks the same.
	var latest int64
	var job string
	require.NoError(t, db.QueryRowx(`SELECT job_name FROM backfill.runs WHERE batch_id = $1`, batch).Scan(&job))
	require.NoError(t, db.Get(&latest, `SELECT max(batch_id) FROM backfill.runs WHERE job_name = $1`, job))
	if latest == batch {
		jcs, err := pm.JobChunks(ctx, db, 0, job)
		require.NoError(t, err)
		require.Len(t, jcs, 1)
		var n int64
		for _, v := range jcs[0].Chunks {
			n += v
		}
		require.Equal(t, int64(rc.Total), n)
		require.Equal(t, int64(rc.Done), jcs[0].Chunks[ChunkDone])
		require.Equal(t, int64(rc.Skipped), jcs[0].Skipped)
	}
}

// TestRollupMatchesRecountAfterRuns: after runs with retried and failed
// chunks, rejected rows, several workers at once, a resume, a
// SkipUnchanged replay and a rollback, the rollups equal a recount of
// the chunks and exceptions, and Status, run_progress and JobChunks give
// the recount's numbers.
func TestRollupMatchesRecountAfterRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE rollup_t (id bigint PRIMARY KEY, v text NOT NULL, n int NOT NULL, backfill_inserted_by bigint, backfill_updated_by bigint)`)
	var (
		mu       sync.Mutex
		attempts = map[int]int{}
		down     = map[int]bool{13: true}
	)
	job := func(newRun bool, change int64) Job {
		return Job{Name: "rollup", Chunker: IntRange(0, 400, 10), Rollback: RollbackUndoLog, NewRun: newRun, SkipUnchanged: true,
			MaxRunRejectRate: -1, Target: Target{Table: "rollup_t", Key: []string{"id"}},
			Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				mu.Lock()
				attempts[c.Seq]++
				n, isDown := attempts[c.Seq], down[c.Seq]
				mu.Unlock()
				if isDown {
					return fmt.Errorf("source of chunk %d is down", c.Seq)
				}
				for id := c.Lo; id < c.Hi; id++ {
					if id%7 == 0 {
						if err := w.Reject(ctx, id, fmt.Sprint("c", id%3), fmt.Sprint("reason ", id%4)); err != nil {
							return err
						}
						continue
					}
					v := fmt.Sprint("v", id)
					if id == change {
						v += "x"
					}
					if err := w.Write(ctx, id, v, int(id)); err != nil {
						return err
					}
					if id == c.Lo+5 && c.Seq%5 == 1 && n == 1 {
						return fmt.Errorf("the source dropped the connection: %w", io.EOF)
					}
				}
				return nil
			})}
	}
	cfg := func(id string) *Config {
		return &Config{WorkerID: id, Concurrency: 3, MaxAttempts: 3, RetryBackoff: 1}
	}
	r1, err := New(db, cfg("w1"))
	require.NoError(t, err)
	_, err = r1.Run(ctx, job(false, -1))
	require.ErrorContains(t, err, "chunk 13 is down")
	b1, err := r1.Status(ctx, job(false, -1))
	require.NoError(t, err)
	require.Equal(t, RunFailed, b1.Status)
	requireStatusIsRecount(t, db, b1.BatchID)

	// Resume with two workers at once.
	mu.Lock()
	delete(down, 13)
	mu.Unlock()
	r2, err := New(db, cfg("w2"))
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range []*Runner{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.Run(ctx, job(false, -1))
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	requireStatusIsRecount(t, db, b1.BatchID)

	// A replay that skips the unchanged chunks, then a restatement.
	rep, err := r1.Run(ctx, job(true, -1))
	require.NoError(t, err)
	require.Positive(t, rep.ChunksSkipped)
	requireStatusIsRecount(t, db, rep.BatchID)
	rep3, err := r1.Run(ctx, job(true, 123))
	require.NoError(t, err)
	requireStatusIsRecount(t, db, rep3.BatchID)

	// A rollback of the latest batch.
	_, err = r1.Rollback(ctx, job(true, 123), RollbackOptions{BatchID: rep3.BatchID, Actor: "ann", Why: "test"})
	require.NoError(t, err)
	for _, b := range []int64{b1.BatchID, rep.BatchID, rep3.BatchID} {
		requireStatusIsRecount(t, db, b)
	}

	// An owner who empties the exception queue, then the chunks, with
	// TRUNCATE (which fires no row or statement trigger of DELETE).
	db.MustExec(`TRUNCATE backfill.exceptions`)
	require.Empty(t, rollupDiff(t, db, "backfill"))
	requireStatusIsRecount(t, db, b1.BatchID)
	db.MustExec(`TRUNCATE backfill.chunks CASCADE`)
	require.Empty(t, rollupDiff(t, db, "backfill"))
	var buckets int
	require.NoError(t, db.Get(&buckets, `SELECT count(*) FROM backfill.chunk_buckets`))
	require.Zero(t, buckets, "chunk_buckets after TRUNCATE of the chunks")
}

// TestRollupUnderConcurrentTransactions: random writes to chunks and
// exceptions (plans inserted, chunks claimed, checkpointed, failed,
// rolled back, deleted; exceptions queued, moved to a failed attempt,
// deleted) from several sessions at once, under read committed and
// repeatable read, some transactions rolled back or aborted by a
// conflict: the rollups always equal a recount.
func TestRollupUnderConcurrentTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	require.NoError(t, NewPGManifest("").Init(ctx, db))
	db.SetMaxOpenConns(8)
	var batch int64
	require.NoError(t, db.Get(&batch, `INSERT INTO backfill.runs (job_name, plan_fingerprint, plan, scope, scope_lower, scope_upper, status, chunks_total)
		VALUES ('rollup_tx', 'fp', '{}', 'int', '0', '1', 'running', 0) RETURNING batch_id`))
	statuses := []string{"pending", "done", "open", "failed", "staged", "rolled_back"}
	rapid.Check(t, func(rt *rapid.T) {
		_, err := db.Exec(`DELETE FROM backfill.chunks; DELETE FROM backfill.exceptions`)
		require.NoError(rt, err)
		// A plan in one statement.
		n := rapid.IntRange(1, 40).Draw(rt, "chunks")
		_, err = db.Exec(`INSERT INTO backfill.chunks (batch_id, seq, chunk_id, kind, lower_bound, upper_bound, lo, hi, start_at, end_at, item)
			SELECT $1, g, 'c' || g, k, g::text, (g + 1)::text,
				CASE WHEN k = 'int' THEN g * 10 END, CASE WHEN k = 'int' THEN g * 10 + 10 - g % 3 END,
				CASE WHEN k = 'time' THEN timestamptz '2024-01-01' + g * interval '1 hour' END,
				CASE WHEN k = 'time' THEN timestamptz '2024-01-01' + (g + 1) * interval '1 hour' END,
				CASE WHEN k = 'list' THEN 'i' || g END
			FROM generate_series(0, $2 - 1) g CROSS JOIN LATERAL (SELECT (ARRAY['int', 'time', 'list'])[1 + g % 3] AS k) x`, batch, n)
		require.NoError(rt, err)
		type op struct {
			kind   int
			seq    int
			status string
			rows   int
			lease  bool
			skip   bool
			reason int
		}
		type txn struct {
			ops      []op
			rr       bool
			rollback bool
		}
		sessions := rapid.IntRange(1, 4).Draw(rt, "sessions")
		work := make([][]txn, sessions)
		for s := range work {
			work[s] = rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) txn {
				return txn{
					ops: rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) op {
						return op{kind: rapid.IntRange(0, 6).Draw(rt, "kind"), seq: rapid.IntRange(0, n-1).Draw(rt, "seq"),
							status: rapid.SampledFrom(statuses).Draw(rt, "status"), rows: rapid.IntRange(0, 50).Draw(rt, "rows"),
							lease: rapid.Bool().Draw(rt, "lease"), skip: rapid.Bool().Draw(rt, "skip"), reason: rapid.IntRange(0, 5).Draw(rt, "reason")}
					}), 1, 6).Draw(rt, "ops"),
					rr:       rapid.Bool().Draw(rt, "rr"),
					rollback: rapid.IntRange(0, 4).Draw(rt, "rollback") == 0,
				}
			}), 1, 8).Draw(rt, "txns")
		}
		var wg sync.WaitGroup
		for _, txns := range work {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, x := range txns {
					runRollupTxn(ctx, db, x.rr, x.rollback, func(tx *sqlx.Tx) error {
						for _, o := range x.ops {
							var err error
							switch o.kind {
							case 0: // a claim: a lease taken or cleared
								_, err = tx.Exec(`UPDATE backfill.chunks SET lease_key = CASE WHEN $3 THEN 'w' END, leased_at = now() WHERE batch_id = $1 AND seq = $2`, batch, o.seq, o.lease)
							case 1, 2: // a checkpoint or a status change, with counts
								ins := o.rows / 2
								_, err = tx.Exec(`UPDATE backfill.chunks SET status = $3, rows_read = $4, rows_inserted = $5, rows_updated = 0,
									rows_unchanged = $4 - $5 - 1, rows_rejected = 1, rows_deduplicated = 0, rows_processed = rows_processed + $4,
									reads = reads + 1, skipped = $6, lease_key = NULL, checkpointed_at = clock_timestamp()
									WHERE batch_id = $1 AND seq = $2`, batch, o.seq, o.status, o.rows+1, ins, o.skip)
							case 3: // a rollback of the batch's chunks from seq on, in one statement
								_, err = tx.Exec(`UPDATE backfill.chunks SET status = 'rolled_back' WHERE batch_id = $1 AND seq >= $2 AND status IN ('done', 'open')`, batch, o.seq)
							case 4: // exceptions queued
								_, err = tx.Exec(`INSERT INTO backfill.exceptions (batch_id, chunk_id, row_number, column_name, reason)
									SELECT $1, 'c' || $2, g, 'col' || ($3 % 2), 'reason ' || $3 FROM generate_series(1, 1 + $4 % 5) g`, batch, o.seq, o.reason, o.rows)
							case 5: // exceptions moved to a failed attempt, or back
								_, err = tx.Exec(`UPDATE backfill.exceptions SET failed_attempt = CASE WHEN $3 THEN 1 END WHERE batch_id = $1 AND chunk_id = 'c' || $2`, batch, o.seq, o.skip)
							case 6: // a chunk or its exceptions deleted
								if o.skip {
									_, err = tx.Exec(`DELETE FROM backfill.exceptions WHERE batch_id = $1 AND chunk_id = 'c' || $2`, batch, o.seq)
								} else {
									_, err = tx.Exec(`DELETE FROM backfill.chunks WHERE batch_id = $1 AND seq = $2`, batch, o.seq)
								}
							}
							if err != nil {
								return err
							}
						}
						return nil
					})
				}
			}()
		}
		wg.Wait()
		require.Empty(rt, rollupDiff(rt, db, "backfill"))
	})
}

// runRollupTxn runs fn in a transaction (repeatable read when rr) and
// commits it, or rolls it back when rollback or when a statement fails
// (a deadlock or a serialization failure between the sessions).
func runRollupTxn(ctx context.Context, db *sqlx.DB, rr, rollback bool, fn func(tx *sqlx.Tx) error) {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return
	}
	if rr {
		if _, err := tx.Exec(`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
			_ = tx.Rollback()
			return
		}
	}
	if err := fn(tx); err != nil || rollback {
		_ = tx.Rollback()
		return
	}
	_ = tx.Commit()
}

// TestMigrateRollupOfExistingRuns: runs recorded before the manifest had
// its rollups (version 25) read the same after the migration: the
// rollups equal a recount, and run_progress gives the numbers it gave
// before.
func TestMigrateRollupOfExistingRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m := NewPGManifest("")
	db.MustExec(`CREATE SCHEMA backfill`)
	db.MustExec(`CREATE TABLE backfill.schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	for v := 1; v <= 25; v++ {
		db.MustExec(m.SQL(pgstore.PgMigrations[v-1]))
		db.MustExec(`INSERT INTO backfill.schema_migrations (version) VALUES ($1)`, v)
	}
	for b := range 3 {
		var batch int64
		require.NoError(t, db.Get(&batch, `INSERT INTO backfill.runs (job_name, plan_fingerprint, plan, scope, scope_lower, scope_upper, status, chunks_total, finished_at)
			VALUES ('old' || $1, 'fp', '{}', 'int', '0', '1', 'completed', 50, now()) RETURNING batch_id`, b))
		db.MustExec(`INSERT INTO backfill.chunks (batch_id, seq, chunk_id, kind, lower_bound, upper_bound, lo, hi, status, rows_read, rows_inserted,
				rows_rejected, rows_processed, reads, checkpointed_at, skipped, lease_key)
			SELECT $1, g, 'c' || g, 'int', g::text, (g + 1)::text, g * 10, g * 10 + 10,
				(ARRAY['done', 'done', 'open', 'failed', 'pending', 'rolled_back'])[1 + g % 6], 10 + g, 9 + g, 1, 10 + g, 1,
				now() - g * interval '1 second', g % 4 = 0, CASE WHEN g % 6 = 4 AND g % 3 = 1 THEN 'w' END
			FROM generate_series(0, 49) g`, batch)
		db.MustExec(`INSERT INTO backfill.exceptions (batch_id, chunk_id, row_number, column_name, reason, failed_attempt)
			SELECT $1, 'c' || g, g, 'col' || g % 3, 'reason ' || g % 5, CASE WHEN g % 7 = 0 THEN 1 END FROM generate_series(0, 49) g`, batch)
	}
	cols := `batch_id, chunks_total, chunks_done, chunks_open, chunks_pending, chunks_failed, chunks_rolled_back, chunks_leased, chunks_skipped,
		rows_read, rows_inserted, rows_rejected, rows_processed, chunk_reads, last_checkpoint, remaining_rows, remaining_chunks`
	var before, after []string
	require.NoError(t, db.Select(&before, `SELECT x::text FROM (SELECT `+cols+` FROM backfill.run_progress ORDER BY batch_id) x`))
	require.NoError(t, m.Migrate(ctx, db))
	require.NoError(t, db.Select(&after, `SELECT x::text FROM (SELECT `+cols+` FROM backfill.run_progress ORDER BY batch_id) x`))
	require.Len(t, before, 3)
	require.Equal(t, before, after)
	require.Empty(t, rollupDiff(t, db, "backfill"))
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM backfill.exception_counts`))
	require.Positive(t, n)
}

// TestLeaseAndFenceWriteNoRollup: a chunk's lease and its fence change
// only its lease, which the rollup does not group by: neither writes a
// row of chunk_counts (the chunk's checkpoint is its one write there),
// and Status counts the leased chunk in flight all the same.
func TestLeaseAndFenceWriteNoRollup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	require.NoError(t, pm.Init(ctx, db))
	ch := IntRange(0, 40, 10)
	chunks, err := ch.Chunks(ctx)
	require.NoError(t, err)
	job := Job{Name: "lease_rollup", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	run, _, err := pm.StartRun(ctx, db, NewPlan(job, TableInfo{Target: job.Target}, chunks), "w", false)
	require.NoError(t, err)
	require.NoError(t, pm.RegisterWorker(ctx, db, backfilltype.Worker{Key: "k", ID: "worker k", BatchID: run.BatchID, Job: job.Name,
		Host: "host", PID: 7, StaleAfter: time.Minute}))
	// The rollups' row versions: a write of a rollup deletes and inserts
	// rows (new ctids and xmins).
	versions := func() string {
		t.Helper()
		var v string
		require.NoError(t, db.Get(&v, `SELECT (SELECT coalesce(string_agg(ctid::text || '/' || xmin::text, ',' ORDER BY ctid), '') FROM backfill.chunk_counts)
			|| ' ' || (SELECT coalesce(string_agg(ctid::text || '/' || xmin::text, ',' ORDER BY ctid), '') FROM backfill.chunk_buckets)`))
		return v
	}
	before := versions()
	l := backfilldriver.Lease{Key: "k", StaleAfter: time.Minute}
	cl, ok, _, err := pm.LeaseChunk(ctx, db, run.BatchID, l)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, before, versions(), "the lease wrote the rollup")
	st, err := pm.Status(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Equal(t, 1, st.Chunks.InFlight)
	requireStatusIsRecount(t, db, run.BatchID)

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, _, ok, err = pm.FenceLease(ctx, tx, run.BatchID, cl.State.Chunk.Seq, cl.Epoch, l)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Commit())
	require.Equal(t, before, versions(), "the fence wrote the rollup")
	st, err = pm.Status(ctx, db, run.BatchID)
	require.NoError(t, err)
	require.Equal(t, 0, st.Chunks.InFlight)
	requireStatusIsRecount(t, db, run.BatchID)
}
