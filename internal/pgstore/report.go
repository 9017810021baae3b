package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Report limits: how much of the long lists a [backfilltype.RunReport] keeps. The
// counts and sums always cover everything.
const (
	// reportExceptionGroups is how many (reason, column) groups of
	// exceptions are kept, the largest first.
	reportExceptionGroups = 100
	// reportExceptionExamples is how many example rows each group keeps.
	reportExceptionExamples = 3
	// reportValidationFailures is how many failed check results are kept.
	reportValidationFailures = 100
	// reportWaits is how many waits are kept, the longest first.
	reportWaits = 20
	// reportThrottlePeriods is how many throttle periods are kept, the
	// first ones.
	reportThrottlePeriods = 200
)

// LoadRunReport reads the report of run batchID from manifest m (whose
// tables db reaches): a handful of queries, whatever the number of chunks.
// It needs only the manifest, not the job's code. db may be a transaction;
// otherwise each part is read in a read-only transaction of its own, so the
// parts of a live run's report may be read moments apart. It returns an
// error wrapping [backfilltype.ErrRunNotFound] when there is no such run.
func LoadRunReport(ctx context.Context, db sqlx.ExtContext, m *Manifest, batchID int64) (backfilltype.RunReport, error) {
	ctx = m.purpose(ctx, "read the run report", batchID)
	var rep backfilltype.RunReport
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		rep, err = m.loadRunReport(ctx, tx, batchID)
		return err
	})
	if err != nil {
		return backfilltype.RunReport{}, fmt.Errorf("backfill: report of batch %d: %w", batchID, err)
	}
	return rep, nil
}

func (m *Manifest) loadRunReport(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.RunReport, error) {
	rep := backfilltype.RunReport{Schema: m.SchemaName}
	run, err := m.Run(ctx, tx, batchID)
	if err != nil {
		return rep, err
	}
	if err := m.reportPlan(ctx, tx, run, &rep.Plan, &rep.GeneratedAt); err != nil {
		return rep, err
	}
	if rep.Totals, err = m.reportTotals(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if backfilltype.IsGraphPlan(run.Plan) {
		gs, err := m.graphStatus(ctx, tx, run)
		if err != nil {
			return rep, err
		}
		rep.Graph = &gs
	}
	if rep.Buckets, err = m.reportBuckets(ctx, tx, batchID, run.ChunksTotal); err != nil {
		return rep, err
	}
	for _, b := range rep.Buckets.Buckets {
		rep.Totals.Attempts += b.Attempts
		rep.Totals.TimedChunks += b.TimedChunks
		rep.Totals.BusySeconds += b.BusySeconds
	}
	if rep.ChunkWorkers, err = m.reportChunkWorkers(ctx, tx, batchID); err != nil {
		return rep, err
	}
	for _, w := range rep.ChunkWorkers {
		if w.Worker != "" {
			rep.Totals.Workers++
		}
	}
	if rep.Durations, err = m.reportDurations(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Notable, err = m.reportNotable(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Workers, err = m.reportWorkers(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Events, rep.EventsOmitted, err = m.reportEvents(ctx, tx, batchID); err != nil {
		return rep, err
	}
	// The time split needs the run's lifecycle events (pauses and what
	// ended them) only, by their partial index.
	lifecycle, err := m.reportEventRows(ctx, tx, `batch_id = $1 AND kind LIKE 'run\_%' ORDER BY id`, batchID)
	if err != nil {
		return rep, err
	}
	periods, err := m.ThrottlePeriods(ctx, tx, batchID)
	if err != nil {
		return rep, err
	}
	waits, err := m.Waits(ctx, tx, batchID)
	if err != nil {
		return rep, err
	}
	if rep.Exceptions, err = m.reportExceptions(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Validations, err = m.reportValidations(ctx, tx, batchID); err != nil {
		return rep, err
	}
	split, paused, err := m.RunTimeSplit(ctx, tx, batchID, lifecycle, periods)
	if err != nil {
		return rep, err
	}
	rep.Time = reportTime(split, periods)
	if rep.Time.WorkingSeconds > 0 {
		rep.Totals.RowsPerSecond = float64(rep.Totals.Rows.Read) / rep.Time.WorkingSeconds
	}
	for _, s := range paused {
		rep.Time.Paused = append(rep.Time.Paused, backfilltype.ReportSpan{From: s.from.UTC(), To: s.to.UTC()})
	}
	rep.Waits = reportWaitsOf(waits)
	// Last: the forecast of the run's rehearsal, if any.
	d := time.Duration((rep.Time.TotalSeconds - rep.Time.PausedSeconds) * float64(time.Second))
	if rep.Forecast, err = m.forecastOf(ctx, tx, batchID, d, rep.Totals.Rows.Read, run.Status == backfilltype.RunCompleted); err != nil {
		return rep, err
	}
	return rep, nil
}

// reportPlan fills p from run and the run's row, and now with the
// server's clock, in one statement.
func (m *Manifest) reportPlan(ctx context.Context, tx sqlx.ExtContext, run backfilltype.Run, p *backfilltype.ReportPlan, now *time.Time) error {
	var plan backfilltype.Plan
	if len(run.Plan) > 0 {
		if err := json.Unmarshal(run.Plan, &plan); err != nil {
			return fmt.Errorf("decode plan: %w", err)
		}
	}
	var row struct {
		Calls int       `db:"calls"`
		Now   time.Time `db:"now"`
		// The kind of the run's chunks (a plan's chunks are of one kind).
		Kind sql.NullString `db:"kind"`
	}
	if err := sqlx.GetContext(ctx, tx, &row, m.SQL(`SELECT calls, now() AS now,
		(SELECT kind FROM {s}.chunks WHERE batch_id = $1 ORDER BY seq LIMIT 1) AS kind
		FROM {s}.runs WHERE batch_id = $1`), run.BatchID); err != nil {
		return err
	}
	calls := row.Calls
	*now = row.Now.UTC()
	*p = backfilltype.ReportPlan{BatchID: run.BatchID, Job: run.Job, Source: run.Source, CodeVersion: run.CodeVersion, Fingerprint: run.Fingerprint,
		Scope: plan.Scope, ScopeLower: run.ScopeLower, ScopeUpper: run.ScopeUpper, ChunksTotal: run.ChunksTotal,
		Target: plan.Target, Rollback: plan.Rollback, Publish: plan.Publish, Time: plan.Time, Status: run.Status,
		StartedBy: run.Worker, CreatedAt: run.CreatedAt.UTC(), FinishedAt: utcPtr(run.FinishedAt), LastError: run.LastError,
		Watermark: utcPtr(run.Watermark), Calls: calls, ChunkKind: row.Kind.String}
	return nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// checkpointed reports whether the rows of a chunk of status count in
// the run's rows, as run_progress counts them.
func checkpointed(status string) bool {
	return status == string(backfilltype.ChunkDone) || status == string(backfilltype.ChunkOpen)
}

// reportCounts are the sums of a group of rollup rows.
type reportCounts struct {
	Status   string  `db:"status"`
	Chunks   int     `db:"chunks"`
	Timed    int     `db:"timed"`
	Attempts int     `db:"attempts"`
	Busy     float64 `db:"busy_seconds"`
	backfilltype.Counts
}

// reportCountsSQL sums the counters of chunk_buckets rows.
const reportCountsSQL = `sum(chunks)::int AS chunks, sum(timed)::int AS timed, sum(attempts)::int AS attempts,
	sum(rows_read)::bigint AS rows_read, sum(rows_inserted)::bigint AS rows_inserted, sum(rows_updated)::bigint AS rows_updated,
	sum(rows_unchanged)::bigint AS rows_unchanged, sum(rows_rejected)::bigint AS rows_rejected,
	sum(rows_deduplicated)::bigint AS rows_deduplicated, sum(busy_seconds)::float8 AS busy_seconds`

func addCounts(a *backfilltype.Counts, b backfilltype.Counts) {
	a.Read += b.Read
	a.Inserted += b.Inserted
	a.Updated += b.Updated
	a.Unchanged += b.Unchanged
	a.Rejected += b.Rejected
	a.Deduplicated += b.Deduplicated
}

// reportTotals reads the run's chunk and row counts from its rollup
// (chunk_counts), as run_progress does (reportBuckets adds its attempts
// and timed chunks).
func (m *Manifest) reportTotals(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ReportTotals, error) {
	t := backfilltype.ReportTotals{ChunksByStatus: map[string]int{}}
	var rows []struct {
		Status  string `db:"status"`
		Skipped bool   `db:"skipped"`
		Chunks  int    `db:"chunks"`
		backfilltype.Counts
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT status, skipped, sum(chunks)::int AS chunks,
		sum(rows_read)::bigint AS rows_read, sum(rows_inserted)::bigint AS rows_inserted, sum(rows_updated)::bigint AS rows_updated,
		sum(rows_unchanged)::bigint AS rows_unchanged, sum(rows_rejected)::bigint AS rows_rejected,
		sum(rows_deduplicated)::bigint AS rows_deduplicated
		FROM {s}.chunk_counts WHERE batch_id = $1 GROUP BY status, skipped`), batchID); err != nil {
		return t, fmt.Errorf("chunk counts: %w", err)
	}
	for _, r := range rows {
		if r.Chunks != 0 {
			t.ChunksByStatus[r.Status] += r.Chunks
		}
		if checkpointed(r.Status) {
			addCounts(&t.Rows, r.Counts)
			if r.Skipped {
				t.ChunksSkipped += r.Chunks
			}
		}
	}
	return t, nil
}

// reportBucketShift returns log2 of the chunks per bucket of a run of
// total chunks: the smallest power of two that gives at most
// ReportMaxBuckets buckets (the width chunk_buckets uses).
func reportBucketShift(total int) int {
	shift := 0
	for backfilltype.ReportMaxBuckets<<shift < total {
		shift++
	}
	return shift
}

// reportBuckets reads the run's buckets of chunks from chunk_buckets.
func (m *Manifest) reportBuckets(ctx context.Context, tx sqlx.ExtContext, batchID int64, total int) (backfilltype.ReportBuckets, error) {
	shift := reportBucketShift(total)
	out := backfilltype.ReportBuckets{ChunksPerBucket: 1 << shift, Buckets: []backfilltype.ReportBucket{}}
	var rows []struct {
		Bucket int `db:"b"`
		reportCounts
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT lo >> $2 AS b, status, `+reportCountsSQL+`
		FROM {s}.chunk_buckets WHERE batch_id = $1 AND kind = 's' GROUP BY 1, 2 ORDER BY 1, 2`), batchID, shift); err != nil {
		return out, fmt.Errorf("chunk buckets: %w", err)
	}
	for _, r := range rows {
		if r.Chunks == 0 {
			continue
		}
		first := r.Bucket << shift
		n := len(out.Buckets)
		if n == 0 || out.Buckets[n-1].FirstSeq != first {
			last := first + 1<<shift - 1
			if total > 0 {
				last = max(first, min(last, total-1))
			}
			out.Buckets = append(out.Buckets, backfilltype.ReportBucket{FirstSeq: first, LastSeq: last, ChunksByStatus: map[string]int{}})
			n++
		}
		b := &out.Buckets[n-1]
		b.Chunks += r.Chunks
		b.ChunksByStatus[r.Status] += r.Chunks
		b.Attempts += r.Attempts
		b.TimedChunks += r.Timed
		b.BusySeconds += r.Busy
		if checkpointed(r.Status) {
			addCounts(&b.Rows, r.Counts)
		}
	}
	for i := range out.Buckets {
		b := &out.Buckets[i]
		if b.TimedChunks > 0 {
			b.MeanSeconds = b.BusySeconds / float64(b.TimedChunks)
		}
		if b.BusySeconds > 0 {
			b.RowsPerSecond = float64(b.Rows.Read) / b.BusySeconds
		}
	}
	return out, nil
}

// reportEvents returns the run's first and last reportEvents/2 events
// (all of them when they are fewer than reportEvents), in order, and
// whether events between them were left out.
func (m *Manifest) reportEvents(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilltype.Event, bool, error) {
	half := backfilltype.ReportMaxEvents / 2
	first, err := m.reportEventRows(ctx, tx, `batch_id = $1 ORDER BY id LIMIT $2`, batchID, half+1)
	if err != nil || len(first) <= half {
		return first, false, err
	}
	last, err := m.reportEventRows(ctx, tx, `batch_id = $1 AND id > $2 ORDER BY id DESC LIMIT $3`, batchID, first[half-1].ID, half+1)
	if err != nil {
		return nil, false, err
	}
	slices.Reverse(last)
	omitted := len(last) > half
	if omitted {
		last = last[1:]
	}
	return append(first[:half], last...), omitted, nil
}

// reportEventRows reads the events that where (a condition on the
// events, an order and a limit) selects.
func (m *Manifest) reportEventRows(ctx context.Context, tx sqlx.ExtContext, where string, args ...any) ([]backfilltype.Event, error) {
	var rows []struct {
		backfilltype.Event
		Batch  sql.NullInt64 `db:"batch"`
		Detail string        `db:"detail_text"`
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT id, batch_id AS batch, job_name, kind, actor, coalesce(db_role, '') AS db_role,
		detail::text AS detail_text, created_at FROM {s}.events WHERE `+where), args...); err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	out := make([]backfilltype.Event, len(rows))
	for i, r := range rows {
		out[i] = r.Event
		out[i].BatchID = r.Batch.Int64
		out[i].Detail = json.RawMessage(r.Detail)
		out[i].CreatedAt = out[i].CreatedAt.UTC()
	}
	return out, nil
}

// reportChunkWorkers sums the run's chunks by the worker that completed
// them, from chunk_buckets.
func (m *Manifest) reportChunkWorkers(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilltype.ReportChunkWorker, error) {
	var rows []struct {
		Worker string `db:"worker"`
		reportCounts
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT worker, status, `+reportCountsSQL+`
		FROM {s}.chunk_buckets WHERE batch_id = $1 AND kind = 'w' GROUP BY 1, 2 ORDER BY 1, 2`), batchID); err != nil {
		return nil, fmt.Errorf("chunk workers: %w", err)
	}
	out := []backfilltype.ReportChunkWorker{}
	for _, r := range rows {
		if r.Chunks == 0 {
			continue
		}
		if n := len(out); n == 0 || out[n-1].Worker != r.Worker {
			out = append(out, backfilltype.ReportChunkWorker{Worker: r.Worker})
		}
		w := &out[len(out)-1]
		w.Chunks += r.Chunks
		w.BusySeconds += r.Busy
		if checkpointed(r.Status) {
			addCounts(&w.Rows, r.Counts)
		}
	}
	slices.SortStableFunc(out, func(a, b backfilltype.ReportChunkWorker) int {
		return cmp.Or(cmp.Compare(b.Chunks, a.Chunks), cmp.Compare(a.Worker, b.Worker))
	})
	return out, nil
}

// reportDurationBin returns the bounds in seconds of bin k of the
// durations histogram of chunk_buckets: 2^(k/4) to 2^((k+1)/4) ms, the
// first from 0.
func reportDurationBin(k int) (from, to float64) {
	if k > 0 {
		from = math.Pow(2, float64(k)/4) / 1000
	}
	return from, math.Pow(2, float64(k+1)/4) / 1000
}

// reportDurations reads the distribution of the timed chunks' durations:
// its histogram from chunk_buckets, its least and greatest by the index
// on durations.
func (m *Manifest) reportDurations(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ReportDurations, error) {
	out := backfilltype.ReportDurations{Bins: []backfilltype.ReportBin{}}
	var bins []struct {
		Bin    int     `db:"lo"`
		Chunks int     `db:"chunks"`
		Busy   float64 `db:"busy_seconds"`
	}
	if err := sqlx.SelectContext(ctx, tx, &bins, m.SQL(`SELECT lo, sum(chunks)::int AS chunks, sum(busy_seconds)::float8 AS busy_seconds
		FROM {s}.chunk_buckets WHERE batch_id = $1 AND kind = 'd' GROUP BY lo HAVING sum(chunks) <> 0 ORDER BY lo`), batchID); err != nil {
		return out, fmt.Errorf("chunk durations: %w", err)
	}
	if len(bins) == 0 {
		return out, nil
	}
	var mm struct {
		Min sql.NullFloat64 `db:"min"`
		Max sql.NullFloat64 `db:"max"`
	}
	if err := sqlx.GetContext(ctx, tx, &mm, m.SQL(`SELECT extract(epoch FROM min(finished_at - started_at))::float8 AS min,
		extract(epoch FROM max(finished_at - started_at))::float8 AS max
		FROM {s}.chunks WHERE batch_id = $1 AND started_at IS NOT NULL AND finished_at IS NOT NULL`), batchID); err != nil {
		return out, fmt.Errorf("chunk durations: %w", err)
	}
	out.Min, out.Max = max(mm.Min.Float64, 0), max(mm.Max.Float64, 0)
	sum := 0.0
	for _, b := range bins {
		from, to := reportDurationBin(b.Bin)
		out.Bins = append(out.Bins, backfilltype.ReportBin{From: from, To: to, Count: b.Chunks})
		out.Count += b.Chunks
		sum += b.Busy
	}
	out.Mean = sum / float64(out.Count)
	// Nearest rank, in the bin that holds it.
	pct := func(p float64) float64 {
		rank, seen := max(1, int(math.Ceil(p*float64(out.Count)))), 0
		for _, b := range out.Bins {
			if seen += b.Count; seen >= rank {
				return max(out.Min, min(b.To, out.Max))
			}
		}
		return out.Max
	}
	out.P50, out.P90, out.P99 = pct(0.5), pct(0.9), pct(0.99)
	return out, nil
}

// reportNotable reads the run's notable chunks by their indexes: the
// slowest, those with the most rejects, the first failed ones and the
// first in flight.
func (m *Manifest) reportNotable(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilltype.ReportChunk, error) {
	var picks []struct {
		Seq int    `db:"seq"`
		Why string `db:"why"`
	}
	if err := sqlx.SelectContext(ctx, tx, &picks, m.SQL(`
		(SELECT seq, 'slowest' AS why FROM {s}.chunks WHERE batch_id = $1 AND started_at IS NOT NULL AND finished_at IS NOT NULL
			ORDER BY finished_at - started_at DESC LIMIT $2)
		UNION ALL
		(SELECT seq, 'most_rejects' FROM {s}.chunks WHERE batch_id = $1 AND rows_rejected > 0 ORDER BY rows_rejected DESC LIMIT $3)
		UNION ALL
		(SELECT seq, 'failed' FROM {s}.chunks WHERE batch_id = $1 AND status = 'failed' ORDER BY seq LIMIT $4)
		UNION ALL
		(SELECT seq, 'in_flight' FROM {s}.chunks WHERE batch_id = $1 AND lease_key IS NOT NULL ORDER BY seq LIMIT $5)`),
		batchID, backfilltype.ReportNotableSlowest, backfilltype.ReportNotableRejects, backfilltype.ReportNotableFailed,
		backfilltype.ReportNotableInFlight); err != nil {
		return nil, fmt.Errorf("notable chunks: %w", err)
	}
	why := map[int][]string{}
	var seqs []int64
	for _, p := range picks {
		if why[p.Seq] == nil {
			seqs = append(seqs, int64(p.Seq))
		}
		why[p.Seq] = append(why[p.Seq], p.Why)
	}
	out := []backfilltype.ReportChunk{}
	if len(seqs) == 0 {
		return out, nil
	}
	var rows []struct {
		Seq        int        `db:"seq"`
		ID         string     `db:"chunk_id"`
		Lower      string     `db:"lower_bound"`
		Upper      string     `db:"upper_bound"`
		Status     string     `db:"status"`
		Attempts   int        `db:"attempts"`
		Worker     string     `db:"worker"`
		StartedAt  *time.Time `db:"started_at"`
		FinishedAt *time.Time `db:"finished_at"`
		LastError  string     `db:"last_error"`
		Skipped    bool       `db:"skipped"`
		InFlight   bool       `db:"in_flight"`
		backfilltype.Counts
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT seq, chunk_id, lower_bound, upper_bound, status, attempts, worker,
		started_at, finished_at, last_error, skipped, lease_key IS NOT NULL AS in_flight,
		rows_read, rows_inserted, rows_updated, rows_unchanged, rows_rejected, rows_deduplicated
		FROM {s}.chunks WHERE batch_id = $1 AND seq = ANY ($2::int[]) ORDER BY seq`), batchID, pq.Array(seqs)); err != nil {
		return nil, fmt.Errorf("notable chunks: %w", err)
	}
	for _, r := range rows {
		c := backfilltype.ReportChunk{Seq: r.Seq, ID: r.ID, Lower: r.Lower, Upper: r.Upper, Status: r.Status, Attempts: r.Attempts, Worker: r.Worker,
			StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt), Counts: r.Counts, LastError: r.LastError, Skipped: r.Skipped,
			InFlight: r.InFlight, Notable: why[r.Seq]}
		if c.StartedAt != nil && c.FinishedAt != nil {
			c.DurationSeconds = c.FinishedAt.Sub(*c.StartedAt).Seconds()
		}
		out = append(out, c)
	}
	return out, nil
}

func (m *Manifest) reportWorkers(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilltype.ReportWorker, error) {
	var rows []backfilltype.ReportWorker
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT worker_id, host, pid, state, started_at, heartbeat_at, finished_at
		FROM {s}.workers WHERE batch_id = $1 ORDER BY started_at, worker_key`), batchID); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}
	for i := range rows {
		rows[i].StartedAt, rows[i].HeartbeatAt, rows[i].FinishedAt = rows[i].StartedAt.UTC(), rows[i].HeartbeatAt.UTC(), utcPtr(rows[i].FinishedAt)
	}
	if rows == nil {
		rows = []backfilltype.ReportWorker{}
	}
	return rows, nil
}

// reportExceptions reads the run's queued exceptions by reason and column
// from their rollup (exception_counts), the first few rows of the
// largest groups by the index on (reason, column, id), and counts the
// failed attempts' rows by their partial index.
func (m *Manifest) reportExceptions(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ReportExceptions, error) {
	var out backfilltype.ReportExceptions
	if err := sqlx.GetContext(ctx, tx, &out, m.SQL(`WITH g AS (
			SELECT reason, column_name, sum(n) AS n FROM {s}.exception_counts WHERE batch_id = $1
			GROUP BY reason, column_name HAVING sum(n) <> 0)
		SELECT (SELECT coalesce(sum(n), 0) FROM g)::bigint AS total, (SELECT count(*) FROM g)::int AS groups_total,
			(SELECT count(*) FROM {s}.exceptions WHERE batch_id = $1 AND failed_attempt IS NOT NULL) AS failed_attempts`), batchID); err != nil {
		return out, fmt.Errorf("exceptions: %w", err)
	}
	// The largest groups, each with its first few rows, in one statement.
	var rows []struct {
		Reason  string         `db:"reason"`
		Column  string         `db:"column_name"`
		Count   int64          `db:"n"`
		ChunkID string         `db:"chunk_id"`
		Row     int64          `db:"row_number"`
		Value   string         `db:"value"`
		Raw     sql.NullString `db:"raw_text"`
		At      time.Time      `db:"created_at"`
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`WITH g AS (
			SELECT reason, column_name, sum(n)::bigint AS n FROM {s}.exception_counts WHERE batch_id = $1
			GROUP BY reason, column_name HAVING sum(n) <> 0 ORDER BY n DESC, reason, column_name LIMIT $2)
		SELECT g.reason, g.column_name, g.n, x.chunk_id, x.row_number, x.value, x.raw::text AS raw_text, x.created_at
		FROM g CROSS JOIN LATERAL (
			SELECT e.id, e.chunk_id, e.row_number, e.value, e.raw, e.created_at FROM {s}.exceptions e
			WHERE e.batch_id = $1 AND e.reason = g.reason AND e.column_name = g.column_name AND e.failed_attempt IS NULL
			ORDER BY e.id LIMIT $3) x
		ORDER BY g.n DESC, g.reason, g.column_name, x.id`), batchID, reportExceptionGroups, reportExceptionExamples); err != nil {
		return out, fmt.Errorf("exceptions: %w", err)
	}
	out.Groups = []backfilltype.ReportExceptionGroup{}
	for _, r := range rows {
		if n := len(out.Groups); n == 0 || out.Groups[n-1].Reason != r.Reason || out.Groups[n-1].Column != r.Column {
			out.Groups = append(out.Groups, backfilltype.ReportExceptionGroup{Reason: r.Reason, Column: r.Column, Count: r.Count})
		}
		e := backfilltype.Exception{BatchID: batchID, ChunkID: r.ChunkID, Row: r.Row, Column: r.Column, Value: r.Value, Reason: r.Reason, CreatedAt: r.At.UTC()}
		if r.Raw.Valid {
			e.Raw = json.RawMessage(r.Raw.String)
		}
		g := &out.Groups[len(out.Groups)-1]
		g.Examples = append(g.Examples, e)
	}
	return out, nil
}

func (m *Manifest) reportValidations(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ReportValidations, error) {
	out := backfilltype.ReportValidations{Checks: []backfilltype.ReportCheck{}, Failures: []backfilltype.Validation{}}
	if err := sqlx.SelectContext(ctx, tx, &out.Checks, m.SQL(`SELECT check_name AS "check", severity,
		count(*) FILTER (WHERE failed_attempt IS NULL) AS results,
		count(*) FILTER (WHERE failed_attempt IS NULL AND passed) AS passed,
		count(*) FILTER (WHERE failed_attempt IS NULL AND NOT passed) AS failed,
		count(*) FILTER (WHERE failed_attempt IS NULL AND NOT passed AND accepted) AS accepted,
		count(*) FILTER (WHERE failed_attempt IS NOT NULL) AS failed_attempts
		FROM {s}.validations WHERE batch_id = $1 GROUP BY check_name, severity ORDER BY check_name, severity`), batchID); err != nil {
		return out, fmt.Errorf("validations: %w", err)
	}
	if err := sqlx.GetContext(ctx, tx, &out.FailuresTotal, m.SQL(`SELECT count(*) FROM {s}.validations WHERE batch_id = $1 AND NOT passed`), batchID); err != nil {
		return out, fmt.Errorf("validations: %w", err)
	}
	var rows []struct {
		ChunkID   string         `db:"chunk_id"`
		Check     string         `db:"check_name"`
		Severity  string         `db:"severity"`
		Expected  string         `db:"expected"`
		Actual    string         `db:"actual"`
		Sample    string         `db:"sample"`
		Detail    sql.NullString `db:"detail"`
		CreatedAt time.Time      `db:"created_at"`
		Failed    sql.NullInt64  `db:"failed_attempt"`
		Accepted  bool           `db:"accepted"`
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT chunk_id, check_name, severity, expected, actual,
		sample::text AS sample, detail::text AS detail, created_at, failed_attempt, accepted
		FROM {s}.validations WHERE batch_id = $1 AND NOT passed ORDER BY id LIMIT $2`), batchID, reportValidationFailures); err != nil {
		return out, fmt.Errorf("validations: %w", err)
	}
	for _, r := range rows {
		v := backfilltype.Validation{BatchID: batchID, ChunkID: r.ChunkID, CreatedAt: r.CreatedAt.UTC(), FailedAttempt: int(r.Failed.Int64),
			CheckResult: backfilltype.CheckResult{Check: r.Check, Severity: backfilltype.Severity(r.Severity), Expected: r.Expected, Actual: r.Actual, Accepted: r.Accepted}}
		if err := json.Unmarshal([]byte(r.Sample), &v.Sample); err != nil {
			return out, fmt.Errorf("validations: sample of %s of chunk %s: %w", r.Check, r.ChunkID, err)
		}
		if r.Detail.Valid {
			v.Detail = json.RawMessage(r.Detail.String)
		}
		out.Failures = append(out.Failures, v)
	}
	return out, nil
}

// reportTime converts split to seconds and sums periods per signal.
func reportTime(split backfilltype.TimeSplit, periods []backfilltype.ThrottlePeriod) backfilltype.ReportTime {
	out := backfilltype.ReportTime{Start: split.Start.UTC(), End: split.End.UTC(), TotalSeconds: split.Total.Seconds(),
		WorkingSeconds: split.Working.Seconds(), PausedSeconds: split.Paused.Seconds(), IdleSeconds: split.Idle.Seconds(),
		ThrottledSeconds: map[string]float64{}, Paused: []backfilltype.ReportSpan{}, Signals: []backfilltype.ReportSignal{}, Periods: []backfilltype.ReportThrottle{}, PeriodsTotal: len(periods)}
	for s, d := range split.Throttled {
		out.ThrottledSeconds[s] = d.Seconds()
	}
	bySignal := map[string]*backfilltype.ReportSignal{}
	for _, p := range periods {
		s := bySignal[p.Signal]
		if s == nil {
			s = &backfilltype.ReportSignal{Signal: p.Signal, MaxValue: p.Value}
			bySignal[p.Signal] = s
		}
		s.Holds++
		s.HeldSeconds += p.Ended.Sub(p.StartedAt).Seconds()
		s.MaxValue = max(s.MaxValue, p.Value)
		if len(out.Periods) < reportThrottlePeriods {
			out.Periods = append(out.Periods, backfilltype.ReportThrottle{Signal: p.Signal, Reason: p.Reason, Value: p.Value, High: p.High, Low: p.Low,
				StartedAt: p.StartedAt.UTC(), EndedAt: p.Ended.UTC(), Open: p.EndedAt == nil})
		}
	}
	for _, s := range bySignal {
		out.Signals = append(out.Signals, *s)
	}
	slices.SortFunc(out.Signals, func(a, b backfilltype.ReportSignal) int { return cmp.Compare(a.Signal, b.Signal) })
	return out
}

// reportWaitsOf summarises waits, keeping the longest.
func reportWaitsOf(waits []backfilltype.Wait) backfilltype.ReportWaits {
	out := backfilltype.ReportWaits{Total: len(waits), BySQLState: map[string]int{}, Longest: []backfilltype.Wait{}}
	for _, w := range waits {
		out.WaitedSeconds += w.Waited.Seconds()
		out.BySQLState[w.SQLState]++
		if w.Final {
			out.Final++
		}
	}
	sorted := slices.Clone(waits)
	slices.SortStableFunc(sorted, func(a, b backfilltype.Wait) int { return cmp.Compare(b.Waited, a.Waited) })
	for _, w := range sorted[:min(len(sorted), reportWaits)] {
		w.At = w.At.UTC()
		if w.Blockers == nil {
			w.Blockers = []backfilltype.Blocker{}
		}
		out.Longest = append(out.Longest, w)
	}
	return out
}
