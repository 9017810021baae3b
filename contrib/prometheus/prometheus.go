// Package backfillprom exports the runs of [backfill] to Prometheus: a
// [prometheus.Collector] that is also the Runner's tracer
// ([backfill.Config.Tracer]).
//
//	c := backfillprom.New(db, backfill.NewPGManifest(""), backfillprom.Options{})
//	prometheus.MustRegister(c)
//	r, err := backfill.New(db, &backfill.Config{Tracer: c})
//
// Two kinds of metrics, with the label job (the job's name):
//
// Read from the manifest at each scrape, alike from any process (the
// runner's, or a monitoring process that never runs a job; then skip the
// Tracer), for the latest run of each job ([Options.Jobs]; all by
// default), in one grouped query ([backfill.PGManifest.JobChunks]). Every
// process that exports them exports the same values: aggregate them with
// max, not sum, or export them from one process only (New with a nil
// manifest in the others):
//
//   - backfill_chunks{job,status} (gauge): chunks of the run by status:
//     pending, leased (pending and held by a live worker: in flight),
//     done, failed, open, staged;
//   - backfill_chunks_skipped{job} (gauge): the done chunks of the run
//     whose staging and merge a replay with [backfill.Job.SkipUnchanged]
//     skipped, their rows unchanged (among backfill_chunks done);
//   - backfill_run_info{job,batch_id,status} (gauge, 1): the run and its
//     status (running, completed, failed, paused, ...);
//   - backfill_lag_seconds{job} (gauge): the run's lag, defined as the
//     time since its latest chunk was checkpointed, by the database
//     server's clock: how long the run has made no progress. Reported
//     only while the run is running and once a chunk is done; an alert
//     on it (lag above a few chunk durations) finds a stalled run.
//
// Observed by this process through the tracer, since it started (rates
// and histograms; sum them across the processes of a run):
//
//   - backfill_rows_total{job,outcome}: rows of committed chunks by
//     outcome (read, inserted, updated, unchanged, rejected,
//     deduplicated);
//   - backfill_chunk_duration_seconds{job,outcome}: histogram of chunk
//     attempts from claim to end, by outcome (done, open, staged,
//     failed, released);
//   - backfill_throttle_seconds_total{job,signal}: time a throttle signal
//     held the claims (counted at release) or the rows-per-second cap
//     made a worker wait (signal rows_per_second);
//   - backfill_retries_total{job,kind,sqlstate,final}: failed tries
//     (kind wait: lock timeout 55P03, deadlock 40P01, serialization
//     failure 40001, statement timeout 57014) and failed attempts (kind
//     attempt; sqlstate empty when the error was not PostgreSQL's);
//   - backfill_exceptions_total{job}: rows sent to the exception queue;
//   - backfill_pauses_total{job,source}: pauses of runs (throttle, gate,
//     observed).
//
// The metric names take [Options.Namespace] ("backfill") as prefix.
package backfillprom

import (
	"context"
	"github.com/pgbackfill/backfill/backfilltype"
	"slices"
	"strconv"
	"time"

	"github.com/pgbackfill/backfill/backfilltrace"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbackfill/backfill"
)

// Options configure [New]. The zero value is valid.
type Options struct {
	// Namespace prefixes the metric names. Default "backfill".
	Namespace string
	// Jobs are the jobs whose latest runs the manifest metrics show.
	// Empty: every job in the manifest.
	Jobs []string
	// StaleAfter is the bound after which a lease of a worker that
	// stopped heartbeating no longer counts as in flight (leased): the
	// runners' [backfill.Config.StaleAfter]. Default
	// [backfill.DefaultStaleAfter].
	StaleAfter time.Duration
	// ScrapeTimeout bounds the manifest query of a scrape. Default 5 s.
	ScrapeTimeout time.Duration
	// Buckets are the chunk-duration histogram's, in seconds. Default:
	// 0.01 s to 10 min.
	Buckets []float64
}

// DefaultBuckets are the default buckets of the chunk-duration
// histogram, in seconds.
var DefaultBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Collector is a [prometheus.Collector] of a manifest's runs and a
// [backfilltrace.Tracer] (with [backfilltrace.ThrottleTracer],
// [backfilltrace.RetryTracer] and [backfilltrace.PauseTracer]) counting what this
// process's Runners do. Safe for concurrent use.
type Collector struct {
	db       sqlx.ExtContext
	manifest *backfill.PGManifest
	opts     Options

	chunks, skipped, runInfo, lag *prometheus.Desc

	rows       *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	throttled  *prometheus.CounterVec
	retries    *prometheus.CounterVec
	exceptions *prometheus.CounterVec
	pauses     *prometheus.CounterVec
}

var (
	_ prometheus.Collector = (*Collector)(nil)
	_ interface {
		backfilltrace.Tracer
		backfilltrace.ThrottleTracer
		backfilltrace.RetryTracer
		backfilltrace.PauseTracer
	} = (*Collector)(nil)
)

// New returns a Collector reading the manifest m (its schema) in db. With
// a nil m it exports only the tracer's metrics: in each worker process
// when one monitoring process (any, with m) exports the manifest's, or
// for Runners on another manifest (backfilltest's fakes).
func New(db sqlx.ExtContext, m *backfill.PGManifest, opts Options) *Collector {
	if opts.Namespace == "" {
		opts.Namespace = "backfill"
	}
	if opts.ScrapeTimeout <= 0 {
		opts.ScrapeTimeout = 5 * time.Second
	}
	if len(opts.Buckets) == 0 {
		opts.Buckets = DefaultBuckets
	}
	ns := opts.Namespace
	return &Collector{db: db, manifest: m, opts: opts,
		chunks: prometheus.NewDesc(ns+"_chunks", "Chunks of the latest run of the job, by status, from the manifest (leased: in flight).",
			[]string{"job", "status"}, nil),
		skipped: prometheus.NewDesc(ns+"_chunks_skipped", "Done chunks of the latest run of the job whose staging and merge were skipped, their rows unchanged (SkipUnchanged), from the manifest.",
			[]string{"job"}, nil),
		runInfo: prometheus.NewDesc(ns+"_run_info", "The latest run of the job (batch_id) and its status, from the manifest; always 1.",
			[]string{"job", "batch_id", "status"}, nil),
		lag: prometheus.NewDesc(ns+"_lag_seconds", "Seconds since the latest chunk of the job's running run was checkpointed (database server clock).",
			[]string{"job"}, nil),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rows_total",
			Help: "Rows of the chunks this process committed, by outcome."}, []string{"job", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "chunk_duration_seconds",
			Help: "Duration of this process's chunk attempts, from claim to end, by outcome.", Buckets: opts.Buckets}, []string{"job", "outcome"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "throttle_seconds_total",
			Help: "Seconds a throttle signal held this process's claims, or its workers waited for the rows-per-second cap."}, []string{"job", "signal"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Failed tries (kind wait) and attempts (kind attempt) of this process's chunks, by SQLSTATE."}, []string{"job", "kind", "sqlstate", "final"}),
		exceptions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "exceptions_total",
			Help: "Rows this process's committed chunks sent to the exception queue."}, []string{"job"}),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "pauses_total",
			Help: "Pauses of runs this process made or saw, by source."}, []string{"job", "source"}),
	}
}

// Describe implements [prometheus.Collector].
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c.manifest != nil {
		ch <- c.chunks
		ch <- c.skipped
		ch <- c.runInfo
		ch <- c.lag
	}
	c.rows.Describe(ch)
	c.duration.Describe(ch)
	c.throttled.Describe(ch)
	c.retries.Describe(ch)
	c.exceptions.Describe(ch)
	c.pauses.Describe(ch)
}

// Collect implements [prometheus.Collector]: the manifest's metrics, read
// now, and the tracer's. A manifest that cannot be read fails the scrape
// with its error (an invalid metric).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.rows.Collect(ch)
	c.duration.Collect(ch)
	c.throttled.Collect(ch)
	c.retries.Collect(ch)
	c.exceptions.Collect(ch)
	c.pauses.Collect(ch)

	if c.manifest == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.ScrapeTimeout)
	defer cancel()
	jobs, err := c.manifest.JobChunks(ctx, c.db, c.opts.StaleAfter, c.opts.Jobs...)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.chunks, err)
		return
	}
	for _, j := range jobs {
		ch <- prometheus.MustNewConstMetric(c.runInfo, prometheus.GaugeValue, 1, j.Job, strconv.FormatInt(j.BatchID, 10), string(j.RunStatus))
		// Every status has a series, 0 when no chunk has it, so that a
		// series does not vanish when its count drops to none.
		for _, status := range chunkStatuses {
			ch <- prometheus.MustNewConstMetric(c.chunks, prometheus.GaugeValue, float64(j.Chunks[status]), j.Job, string(status))
		}
		for status, n := range j.Chunks {
			if !slices.Contains(chunkStatuses, status) {
				ch <- prometheus.MustNewConstMetric(c.chunks, prometheus.GaugeValue, float64(n), j.Job, string(status))
			}
		}
		ch <- prometheus.MustNewConstMetric(c.skipped, prometheus.GaugeValue, float64(j.Skipped), j.Job)
		if j.RunStatus == backfill.RunRunning && !j.LastDone.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, max(j.SinceLastDone.Seconds(), 0), j.Job)
		}
	}
}

// chunkStatuses are the statuses backfill_chunks always has a series
// for.
var chunkStatuses = []backfill.ChunkStatus{backfill.ChunkPending, backfilltype.ChunkLeased, backfill.ChunkDone, backfill.ChunkFailed, backfill.ChunkOpen}

// TraceChunkStart implements [backfilltrace.Tracer]; it returns ctx.
func (c *Collector) TraceChunkStart(ctx context.Context, _ backfilltrace.ChunkStartData) context.Context {
	return ctx
}

// TraceChunkEnd implements [backfilltrace.Tracer]: the chunk's duration, and
// the rows and exceptions of a committed chunk.
func (c *Collector) TraceChunkEnd(_ context.Context, d backfilltrace.ChunkEndData) {
	c.duration.WithLabelValues(d.Job, d.Outcome).Observe(d.Duration.Seconds())
	if d.Outcome == backfilltrace.OutcomeFailed || d.Outcome == backfilltrace.OutcomeReleased {
		return
	}
	for _, o := range []struct {
		name string
		n    int64
	}{{"read", d.Counts.Read}, {"inserted", d.Counts.Inserted}, {"updated", d.Counts.Updated},
		{"unchanged", d.Counts.Unchanged}, {"rejected", d.Counts.Rejected}, {"deduplicated", d.Counts.Deduplicated}} {
		if o.n != 0 {
			c.rows.WithLabelValues(d.Job, o.name).Add(float64(o.n))
		}
	}
	if d.Counts.Rejected > 0 {
		c.exceptions.WithLabelValues(d.Job).Add(float64(d.Counts.Rejected))
	}
}

// TraceThrottle implements [backfilltrace.ThrottleTracer]: the time held or
// waited.
func (c *Collector) TraceThrottle(_ context.Context, d backfilltrace.ThrottleData) {
	if d.Held > 0 {
		c.throttled.WithLabelValues(d.Job, d.Signal).Add(d.Held.Seconds())
	}
}

// TraceRetry implements [backfilltrace.RetryTracer].
func (c *Collector) TraceRetry(_ context.Context, d backfilltrace.RetryData) {
	c.retries.WithLabelValues(d.Job, d.Kind, d.SQLState, strconv.FormatBool(d.Final)).Inc()
}

// TracePause implements [backfilltrace.PauseTracer].
func (c *Collector) TracePause(_ context.Context, d backfilltrace.PauseData) {
	c.pauses.WithLabelValues(d.Job, d.Source).Inc()
}
