package pgstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/jmoiron/sqlx"
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
	// ReportRateBuckets is about how many buckets the rows/s series has.
	ReportRateBuckets = 60
	// reportHistogramBins is how many bins the chunk-duration histogram has.
	reportHistogramBins = 20
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
	if err := sqlx.GetContext(ctx, tx, &rep.GeneratedAt, `SELECT now()`); err != nil {
		return rep, err
	}
	rep.GeneratedAt = rep.GeneratedAt.UTC()
	if err := m.reportPlan(ctx, tx, run, &rep.Plan); err != nil {
		return rep, err
	}
	if rep.Chunks, rep.Plan.ChunkKind, err = m.reportChunks(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Workers, err = m.reportWorkers(ctx, tx, batchID); err != nil {
		return rep, err
	}
	if rep.Events, err = m.Events(ctx, tx, batchID); err != nil {
		return rep, err
	}
	for i := range rep.Events {
		rep.Events[i].CreatedAt = rep.Events[i].CreatedAt.UTC()
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
	rep.Totals = reportTotals(rep.Chunks)
	rep.Throughput = BuildReportThroughput(rep.Chunks, ReportRateBuckets)
	rep.Durations = BuildReportDurations(rep.Chunks, reportHistogramBins)
	split, paused, err := m.RunTimeSplit(ctx, tx, batchID, rep.Events, periods)
	if err != nil {
		return rep, err
	}
	rep.Time = reportTime(split, periods)
	for _, s := range paused {
		rep.Time.Paused = append(rep.Time.Paused, backfilltype.ReportSpan{From: s.from.UTC(), To: s.to.UTC()})
	}
	rep.Waits = reportWaitsOf(waits)
	return rep, nil
}

func (m *Manifest) reportPlan(ctx context.Context, tx sqlx.ExtContext, run backfilltype.Run, p *backfilltype.ReportPlan) error {
	var plan backfilltype.Plan
	if len(run.Plan) > 0 {
		if err := json.Unmarshal(run.Plan, &plan); err != nil {
			return fmt.Errorf("decode plan: %w", err)
		}
	}
	var calls int
	if err := sqlx.GetContext(ctx, tx, &calls, m.SQL(`SELECT calls FROM {s}.runs WHERE batch_id = $1`), run.BatchID); err != nil {
		return err
	}
	*p = backfilltype.ReportPlan{BatchID: run.BatchID, Job: run.Job, Source: run.Source, CodeVersion: run.CodeVersion, Fingerprint: run.Fingerprint,
		Scope: plan.Scope, ScopeLower: run.ScopeLower, ScopeUpper: run.ScopeUpper, ChunksTotal: run.ChunksTotal,
		Target: plan.Target, Rollback: plan.Rollback, Publish: plan.Publish, Time: plan.Time, Status: run.Status,
		StartedBy: run.Worker, CreatedAt: run.CreatedAt.UTC(), FinishedAt: utcPtr(run.FinishedAt), LastError: run.LastError,
		Watermark: utcPtr(run.Watermark), Calls: calls}
	return nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// reportChunks returns the chunks of the run and their kind.
func (m *Manifest) reportChunks(ctx context.Context, tx sqlx.ExtContext, batchID int64) ([]backfilltype.ReportChunk, string, error) {
	var rows []struct {
		Seq        int        `db:"seq"`
		ID         string     `db:"chunk_id"`
		Kind       string     `db:"kind"`
		Lower      string     `db:"lower_bound"`
		Upper      string     `db:"upper_bound"`
		Status     string     `db:"status"`
		Attempts   int        `db:"attempts"`
		Worker     string     `db:"worker"`
		StartedAt  *time.Time `db:"started_at"`
		FinishedAt *time.Time `db:"finished_at"`
		LastError  string     `db:"last_error"`
		Skipped    bool       `db:"skipped"`
		backfilltype.Counts
	}
	if err := sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT seq, chunk_id, kind, lower_bound, upper_bound, status, attempts, worker,
		started_at, finished_at, last_error, skipped, rows_read, rows_inserted, rows_updated, rows_unchanged, rows_rejected, rows_deduplicated
		FROM {s}.chunks WHERE batch_id = $1 ORDER BY seq`), batchID); err != nil {
		return nil, "", fmt.Errorf("chunks: %w", err)
	}
	out := make([]backfilltype.ReportChunk, len(rows))
	for i, r := range rows {
		c := backfilltype.ReportChunk{Seq: r.Seq, ID: r.ID, Lower: r.Lower, Upper: r.Upper, Status: r.Status, Attempts: r.Attempts, Worker: r.Worker,
			StartedAt: utcPtr(r.StartedAt), FinishedAt: utcPtr(r.FinishedAt), Counts: r.Counts, LastError: r.LastError, Skipped: r.Skipped}
		if c.StartedAt != nil && c.FinishedAt != nil {
			c.DurationSeconds = c.FinishedAt.Sub(*c.StartedAt).Seconds()
		}
		out[i] = c
	}
	kind := ""
	if len(rows) > 0 {
		kind = rows[0].Kind // a plan's chunks are of one kind
	}
	return out, kind, nil
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

func (m *Manifest) reportExceptions(ctx context.Context, tx sqlx.ExtContext, batchID int64) (backfilltype.ReportExceptions, error) {
	var out backfilltype.ReportExceptions
	if err := sqlx.GetContext(ctx, tx, &out, m.SQL(`SELECT count(*) FILTER (WHERE failed_attempt IS NULL) AS total,
		count(*) FILTER (WHERE failed_attempt IS NOT NULL) AS failed_attempts,
		count(DISTINCT (reason, column_name)) FILTER (WHERE failed_attempt IS NULL) AS groups_total
		FROM {s}.exceptions WHERE batch_id = $1`), batchID); err != nil {
		return out, fmt.Errorf("exceptions: %w", err)
	}
	// The largest groups, each with its first few rows (in chunk and row
	// order), in one statement.
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
			SELECT reason, column_name, count(*) AS n FROM {s}.exceptions
			WHERE batch_id = $1 AND failed_attempt IS NULL
			GROUP BY reason, column_name ORDER BY n DESC, reason, column_name LIMIT $2),
		x AS (
			SELECT e.reason, e.column_name, e.chunk_id, e.row_number, e.value, e.raw::text AS raw_text, e.created_at,
				row_number() OVER (PARTITION BY e.reason, e.column_name ORDER BY c.seq, e.row_number, e.id) AS k
			FROM {s}.exceptions e JOIN {s}.chunks c ON c.batch_id = e.batch_id AND c.chunk_id = e.chunk_id
			JOIN g ON g.reason = e.reason AND g.column_name = e.column_name
			WHERE e.batch_id = $1 AND e.failed_attempt IS NULL)
		SELECT g.reason, g.column_name, g.n, x.chunk_id, x.row_number, x.value, x.raw_text, x.created_at
		FROM g JOIN x ON x.reason = g.reason AND x.column_name = g.column_name AND x.k <= $3
		ORDER BY g.n DESC, g.reason, g.column_name, x.k`), batchID, reportExceptionGroups, reportExceptionExamples); err != nil {
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

// reportTotals sums chunks.
func reportTotals(chunks []backfilltype.ReportChunk) backfilltype.ReportTotals {
	t := backfilltype.ReportTotals{ChunksByStatus: map[string]int{}}
	workers := map[string]bool{}
	for _, c := range chunks {
		t.ChunksByStatus[c.Status]++
		if c.Skipped && (c.Status == string(backfilltype.ChunkDone) || c.Status == string(backfilltype.ChunkOpen)) {
			t.ChunksSkipped++
		}
		t.Attempts += c.Attempts
		t.Rows.Read += c.Counts.Read
		t.Rows.Inserted += c.Counts.Inserted
		t.Rows.Updated += c.Counts.Updated
		t.Rows.Unchanged += c.Counts.Unchanged
		t.Rows.Rejected += c.Counts.Rejected
		t.Rows.Deduplicated += c.Counts.Deduplicated
		if c.Worker != "" {
			workers[c.Worker] = true
		}
		if c.StartedAt != nil && (t.FirstStart == nil || c.StartedAt.Before(*t.FirstStart)) {
			t.FirstStart = c.StartedAt
		}
		if c.FinishedAt != nil && (t.LastFinish == nil || c.FinishedAt.After(*t.LastFinish)) {
			t.LastFinish = c.FinishedAt
		}
	}
	t.Workers = len(workers)
	if t.FirstStart != nil && t.LastFinish != nil {
		if d := t.LastFinish.Sub(*t.FirstStart).Seconds(); d > 0 {
			t.RowsPerSecond = float64(t.Rows.Read) / d
		}
	}
	return t
}

// reportBucketSteps are the widths the rows/s series picks from: the
// smallest that gives at most the wanted number of buckets.
var reportBucketSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// BuildReportThroughput spreads each timed chunk's rows read evenly over its
// start to finish and sums them in about n buckets.
func BuildReportThroughput(chunks []backfilltype.ReportChunk, n int) backfilltype.ReportThroughput {
	out := backfilltype.ReportThroughput{Buckets: []backfilltype.ReportRate{}}
	first, last := timedSpan(chunks)
	if first.IsZero() {
		return out
	}
	width := bucketWidth(last.Sub(first), n)
	first = first.Truncate(width)
	k := int(last.Sub(first)/width) + 1
	tb := throughputBuckets{first: first, width: width, rows: make([]float64, k)}
	for _, c := range chunks {
		if c.StartedAt == nil || c.FinishedAt == nil || c.Counts.Read == 0 {
			continue
		}
		tb.add(*c.StartedAt, *c.FinishedAt, float64(c.Counts.Read))
	}
	out.Start = &first
	out.BucketSeconds = width.Seconds()
	for i, r := range tb.rows {
		out.Buckets = append(out.Buckets, backfilltype.ReportRate{Start: first.Add(time.Duration(i) * width), Rows: r, RowsPerSecond: r / width.Seconds()})
	}
	return out
}

// timedSpan returns the earliest start and the latest finish of the
// chunks that have both; zero times when none has.
func timedSpan(chunks []backfilltype.ReportChunk) (first, last time.Time) {
	for _, c := range chunks {
		if c.StartedAt == nil || c.FinishedAt == nil {
			continue
		}
		if first.IsZero() || c.StartedAt.Before(first) {
			first = *c.StartedAt
		}
		if last.IsZero() || c.FinishedAt.After(last) {
			last = *c.FinishedAt
		}
	}
	return first, last
}

// bucketWidth returns the smallest of reportBucketSteps that covers span
// in at most n buckets, else the largest step.
func bucketWidth(span time.Duration, n int) time.Duration {
	for _, w := range reportBucketSteps {
		if span <= w*time.Duration(n) {
			return w
		}
	}
	return reportBucketSteps[len(reportBucketSteps)-1]
}

// throughputBuckets are the rows of a throughput series: rows[i] is what
// was read in the bucket that starts at first + i*width.
type throughputBuckets struct {
	first time.Time
	width time.Duration
	rows  []float64
}

// add spreads read rows evenly over the interval from a to b across the
// buckets it overlaps; a chunk that took no time counts whole in the
// bucket of a (the last bucket at most).
func (tb *throughputBuckets) add(a, b time.Time, read float64) {
	first, width, k := tb.first, tb.width, len(tb.rows)
	if !b.After(a) {
		tb.rows[min(int(a.Sub(first)/width), k-1)] += read
		return
	}
	per := read / float64(b.Sub(a))
	for i := int(a.Sub(first) / width); i < k; i++ {
		from := first.Add(time.Duration(i) * width)
		to := from.Add(width)
		if !from.Before(b) {
			break
		}
		lo, hi := from, to
		if a.After(lo) {
			lo = a
		}
		if b.Before(hi) {
			hi = b
		}
		if hi.After(lo) {
			tb.rows[i] += per * float64(hi.Sub(lo))
		}
	}
}

// BuildReportDurations is the distribution of the timed chunks' durations,
// with a histogram of equal bins from the least to the greatest: at most
// bins, about the square root of the number of chunks.
func BuildReportDurations(chunks []backfilltype.ReportChunk, bins int) backfilltype.ReportDurations {
	out := backfilltype.ReportDurations{Bins: []backfilltype.ReportBin{}}
	var ds []float64
	for _, c := range chunks {
		if c.StartedAt != nil && c.FinishedAt != nil {
			ds = append(ds, c.DurationSeconds)
		}
	}
	if len(ds) == 0 {
		return out
	}
	sort.Float64s(ds)
	sum := 0.0
	for _, d := range ds {
		sum += d
	}
	// Nearest rank.
	pct := func(p float64) float64 { return ds[max(0, int(math.Ceil(p*float64(len(ds))))-1)] }
	out.Count, out.Min, out.Max, out.Mean = len(ds), ds[0], ds[len(ds)-1], sum/float64(len(ds))
	out.P50, out.P90, out.P99 = pct(0.5), pct(0.9), pct(0.99)
	if out.Max == out.Min {
		out.Bins = append(out.Bins, backfilltype.ReportBin{From: out.Min, To: out.Max, Count: len(ds)})
		return out
	}
	// Fewer bins for few chunks: about the square root of their number.
	bins = min(bins, max(1, int(math.Ceil(math.Sqrt(float64(len(ds)))))))
	w := (out.Max - out.Min) / float64(bins)
	for i := range bins {
		out.Bins = append(out.Bins, backfilltype.ReportBin{From: out.Min + float64(i)*w, To: out.Min + float64(i+1)*w})
	}
	out.Bins[bins-1].To = out.Max
	for _, d := range ds {
		out.Bins[min(int((d-out.Min)/w), bins-1)].Count++
	}
	return out
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
