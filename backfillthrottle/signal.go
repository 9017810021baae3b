package backfillthrottle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Signal is a measurement a [Throttle] watches: replica lag, WAL rate, the
// latency of a probe query, a schedule. Read is called every
// backfill.Config.ThrottleInterval by one goroutine per call of
// backfill.Runner.Run (never concurrently for one Signal value), with a
// context that ends after that interval. The built-in signals are
// [ReplicaLagSignal], [WALRateSignal], [ArchiveBacklogSignal],
// [AutovacuumSignal], [LockWaitersSignal], [ProbeLatencySignal],
// [SQLSignal], a [Schedule] ([ScheduleThrottle]) and the signal of
// [LatencyGoal] (a whole Throttle).
type Signal interface {
	// Name names the signal in logs and in the manifest's throttle
	// periods (e.g. "replica_lag").
	Name() string
	// Read returns the signal's value now, in the signal's unit. db is
	// the Runner's database; a Read with bind parameters must run them
	// in a transaction (behind a transaction pooler).
	//
	// An error is logged. Until a reading of the signal has succeeded, a
	// failed reading that ctx's deadline did not end (a typo in a query,
	// a missing privilege) fails the call of backfill.Runner.Run with an
	// error wrapping [backfilltype.ErrInvalidConfig] naming the signal;
	// the first reading is taken when the call starts, before it claims
	// anything. Once the signal has read, the throttle fails closed: the
	// first and second failed readings in a row are skipped (the throttle
	// keeps its state, held or not); from the third in a row on, each
	// failed reading counts as above High (never as Critical: the run is
	// not paused), so the throttle holds (an adaptive one,
	// [Throttle.Adapt], cuts its rate as for such a reading), until a
	// reading succeeds. That reading is then observed as usual: below Low
	// it releases the hold (once it has lasted MinHold), and it starts the
	// count of failures in a row again. Readings cut by ctx's deadline
	// before the signal has ever read count as failures in a row too.
	Read(ctx context.Context, db sqlx.ExtContext, scope SignalScope) (float64, error)
}

// SignalScope is what a [Signal] may need to know about the run it is
// read for.
type SignalScope struct {
	// BatchID is the run's batch.
	BatchID int64
	// Table is the run's target table, quoted and schema-qualified
	// ("public"."orders" style, for to_regclass).
	Table string
	// WorkerKeys are the keys of the run's registered workers
	// ([backfilltype.Worker.Key]); their chunk transactions carry
	// application_name "backfill <key> ...". Empty when the manifest has no
	// workers.
	WorkerKeys []string
}

// Observer is a [Signal] that can tell whether it observes what it
// guards: a [ReplicaLagSignal] on a server with no replica reads 0 forever,
// and its throttle never holds. Every call of backfill.Runner.Run asks
// each of its throttles' signals that implements Observer when the call
// starts, then every [ObserveInterval]. A signal that guards nothing is
// logged at WARN (once, and again only when the answer changes), recorded
// in the run's audit trail (event backfilltype.EventSignalInert, and
// backfilltype.EventSignalObserves when it observes again) and shown by
// backfill.Runner.Status (backfilltype.Status.ThrottleWarnings) and by
// "backfill status". The throttle keeps reading the signal as usual.
//
// The built-in signals that implement it: [ReplicaLagSignal] (no replica,
// or a role that cannot see the replicas' lag), [ArchiveBacklogSignal]
// (archive_mode off), [AutovacuumSignal] (autovacuum off for the server or
// the table, no such table, or a role that cannot see autovacuum's
// progress) and [LockWaitersSignal] (a role that cannot see the waits of
// other roles' sessions).
type Observer interface {
	Signal
	// Observes reports whether the signal can observe what it guards on
	// db, the Runner's database (run bind parameters in a transaction, as
	// Read does). ok false comes with why: a sentence for an operator
	// naming what is missing and what to do. A non-nil err means the
	// question could not be answered (it is logged at DEBUG and asked
	// again after ObserveInterval); ok and why are then ignored.
	Observes(ctx context.Context, db sqlx.ExtContext, scope SignalScope) (ok bool, why string, err error)
}

// ObserveInterval is how often a call of backfill.Runner.Run asks its
// [Observer] signals again whether they observe what they guard (a
// replica attached since the call started clears the warning), besides
// once when the call starts.
const ObserveInterval = time.Minute

type sqlSignal struct {
	SignalName string `json:"-" db:"-"`
	query      string
	args       func(SignalScope) []any
	// observe, when not "", is a query run with observeArgs that returns
	// why the signal guards nothing, or '' (or no row) when it observes.
	observe     string
	observeArgs func(SignalScope) []any
}

func (s sqlSignal) Name() string { return s.SignalName }

// Observes implements [Observer]; a signal without an observe query
// observes.
func (s sqlSignal) Observes(ctx context.Context, db sqlx.ExtContext, scope SignalScope) (bool, string, error) {
	if s.observe == "" {
		return true, "", nil
	}
	var args []any
	if s.observeArgs != nil {
		args = s.observeArgs(scope)
	}
	var why []string
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		why = why[:0]
		return sqlx.SelectContext(ctx, tx, &why, s.observe, args...)
	})
	if err != nil {
		return false, "", fmt.Errorf("backfill: signal %s: whether it observes what it guards: %w", s.SignalName, err)
	}
	if len(why) == 0 || why[0] == "" {
		return true, "", nil
	}
	return false, why[0], nil
}

// readAllStatsSQL is true when the session's role sees the statistics of
// every session (pg_read_all_stats, a member of pg_monitor, or a
// superuser).
const readAllStatsSQL = `pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`

func (s sqlSignal) Read(ctx context.Context, db sqlx.ExtContext, scope SignalScope) (float64, error) {
	var args []any
	if s.args != nil {
		args = s.args(scope)
	}
	var v float64
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		var err error
		v, err = scanNumber(ctx, tx, s.query, args...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("backfill: signal %s: %w", s.SignalName, err)
	}
	return v, nil
}

// scanNumber runs query and reads its one value as a number: a boolean
// is 1 (true) or 0, NULL and no row are 0.
func scanNumber(ctx context.Context, db sqlx.ExtContext, query string, args ...any) (float64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var raw any
	if rows.Next() {
		if err := rows.Scan(&raw); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	switch v := raw.(type) {
	case nil:
		return 0, nil
	case bool:
		if v {
			return 1, nil
		}
		return 0, nil
	case int64:
		return float64(v), nil
	case float64:
		return v, nil
	case []byte:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return 0, fmt.Errorf("value %q is not a number or a boolean", v)
		}
		return f, nil
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("value %q is not a number or a boolean", v)
		}
		return f, nil
	}
	return 0, fmt.Errorf("value %v (%T) is not a number or a boolean", raw, raw)
}

// ReplicaLagSignal is the replay lag of the server's replicas, in
// seconds: the largest replay_lag of pg_stat_replication (0 without
// replicas). The role needs pg_monitor (or pg_read_all_stats) to see the
// lag of replicas it did not connect. Name "replica_lag".
//
// It guards nothing ([Observer]) on a server with no replica
// (pg_stat_replication empty), and for a role without pg_read_all_stats
// that sees none of the replicas' state.
func ReplicaLagSignal() Signal {
	return sqlSignal{SignalName: "replica_lag", query: `SELECT coalesce(max(extract(epoch FROM replay_lag)), 0)::float8 FROM pg_stat_replication`,
		observe: `SELECT CASE
			WHEN NOT EXISTS (SELECT FROM pg_stat_replication) THEN
				'the server has no replicas (pg_stat_replication is empty), so replica_lag reads 0 and its throttle never holds'
				|| CASE WHEN pg_is_in_recovery() THEN ' (it is a standby: run the backfill against the primary)'
					ELSE '; attach the replicas it should guard, or drop the throttle' END
			WHEN NOT ` + readAllStatsSQL + ` AND NOT EXISTS (SELECT FROM pg_stat_replication WHERE state IS NOT NULL) THEN
				format('role %I cannot see the replicas'' lag (pg_stat_replication shows it only to pg_read_all_stats), so replica_lag reads 0; GRANT pg_monitor TO %I', current_user, current_user)
			ELSE '' END`}
}

// ArchiveBacklogSignal is the number of WAL segments written but not yet
// archived (pg_stat_archiver; 0 with archive_mode off or nothing
// archived yet). Name "archive_backlog". Reading pg_current_wal_lsn
// needs a primary. It guards nothing ([Observer]) with archive_mode off.
func ArchiveBacklogSignal() Signal {
	return sqlSignal{SignalName: "archive_backlog",
		observe: `SELECT CASE WHEN current_setting('archive_mode') = 'off' THEN
			'archive_mode is off, so archive_backlog reads 0 and its throttle never holds; turn archiving on, or drop the throttle' ELSE '' END`,
		query: `
		SELECT CASE WHEN current_setting('archive_mode') = 'off' OR a.last_archived_wal IS NULL
			OR length(a.last_archived_wal) <> 24 OR a.last_archived_wal !~ '^[0-9A-F]{24}$' THEN 0
		ELSE greatest(0,
			(('x' || lpad(substr(w.name, 9, 8), 16, '0'))::bit(64)::bigint * (4294967296 / s.seg) + ('x' || lpad(substr(w.name, 17, 8), 16, '0'))::bit(64)::bigint)
			- (('x' || lpad(substr(a.last_archived_wal, 9, 8), 16, '0'))::bit(64)::bigint * (4294967296 / s.seg) + ('x' || lpad(substr(a.last_archived_wal, 17, 8), 16, '0'))::bit(64)::bigint)
			- 1)
		END::float8
		FROM pg_stat_archiver a,
			(SELECT pg_walfile_name(pg_current_wal_lsn()) AS name) w,
			(SELECT setting::bigint * CASE unit WHEN '8kB' THEN 8192 WHEN 'MB' THEN 1048576 ELSE 1 END AS seg
				FROM pg_settings WHERE name = 'wal_segment_size') s`}
}

// WALRateSignal is the rate at which the server generates WAL, in bytes
// per second, between two readings (pg_current_wal_insert_lsn; the first
// reading is 0). It keeps the previous reading: use one value per
// Throttle. Name "wal_rate". Needs a primary.
func WALRateSignal() Signal { return &walRate{} }

type walRate struct {
	mu   sync.Mutex
	lsn  float64
	at   time.Time
	read bool
}

func (w *walRate) Name() string { return "wal_rate" }

func (w *walRate) Read(ctx context.Context, db sqlx.ExtContext, _ SignalScope) (float64, error) {
	var lsn float64
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &lsn, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::float8`)
	})
	if err != nil {
		return 0, fmt.Errorf("backfill: signal wal_rate: %w", err)
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, at, ok := w.lsn, w.at, w.read
	w.lsn, w.at, w.read = lsn, now, true
	if !ok || !now.After(at) {
		return 0, nil
	}
	return max(lsn-prev, 0) / now.Sub(at).Seconds(), nil
}

// AutovacuumSignal is the number of autovacuum workers processing the run's
// target table (pg_stat_progress_vacuum joined to pg_stat_activity's
// autovacuum workers), or table when it is not "" (a possibly
// schema-qualified name, quoted as [backfilltype.Target.Table] is). Name
// "autovacuum". Hold at High 1 to leave the table to autovacuum. It
// guards nothing ([Observer]) when autovacuum is off (for the server, or
// the table's autovacuum_enabled), when the table does not exist, and for
// a role without pg_read_all_stats, which does not see which table an
// autovacuum worker processes.
func AutovacuumSignal(table string) Signal {
	args := func(s SignalScope) []any {
		if table != "" {
			return []any{pgstore.QuotedTable(table)}
		}
		return []any{s.Table}
	}
	return sqlSignal{SignalName: "autovacuum", args: args, observeArgs: args, query: `SELECT count(*)::float8 FROM pg_stat_progress_vacuum p
			JOIN pg_stat_activity a ON a.pid = p.pid
			WHERE p.relid = to_regclass($1) AND a.backend_type = 'autovacuum worker'`,
		observe: `SELECT CASE
			WHEN NOT current_setting('autovacuum')::bool THEN
				'autovacuum is off on the server, so the autovacuum signal reads 0 and its throttle never holds; drop the throttle'
			WHEN to_regclass($1::text) IS NULL THEN
				format('table %s does not exist, so the autovacuum signal reads 0 and its throttle never holds; name the table the backfill writes', $1)
			WHEN EXISTS (SELECT FROM pg_class c WHERE c.oid = to_regclass($1) AND 'autovacuum_enabled=false' = ANY (c.reloptions)) THEN
				format('autovacuum is off for table %s (autovacuum_enabled = false), so the autovacuum signal reads 0 and its throttle never holds; drop the throttle', $1)
			WHEN NOT ` + readAllStatsSQL + ` THEN
				format('role %I cannot see which table an autovacuum worker processes (pg_stat_progress_vacuum shows it only to pg_read_all_stats), so the autovacuum signal reads 0; GRANT pg_monitor TO %I', current_user, current_user)
			ELSE '' END`}
}

// LockWaitersSignal is the number of sessions, not the library's own,
// waiting for a lock held by a session of this run's workers (their
// application_name starts with "backfill <worker key> " while a chunk
// runs; see pg_blocking_pids). Without registered workers it counts the
// waiters of any backfill session. Name "lock_waiters". Seeing other
// roles' sessions needs pg_read_all_stats (or pg_monitor): without it
// the signal guards nothing ([Observer]) but the sessions of its own role.
func LockWaitersSignal() Signal {
	return sqlSignal{SignalName: "lock_waiters",
		observe: `SELECT CASE WHEN NOT ` + readAllStatsSQL + ` THEN
			format('role %I cannot see the waits of other roles'' sessions (pg_stat_activity shows them only to pg_read_all_stats), so lock_waiters counts only the waiters of its own role; GRANT pg_monitor TO %I', current_user, current_user)
			ELSE '' END`,
		query: `SELECT count(DISTINCT w.pid)::float8
			FROM pg_stat_activity w
			CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)
			JOIN pg_stat_activity h ON h.pid = b.pid
			WHERE w.wait_event_type = 'Lock'
				AND w.application_name NOT LIKE 'backfill %'
				AND h.application_name LIKE 'backfill %'
				AND (cardinality($1::text[]) = 0 OR split_part(h.application_name, ' ', 2) = ANY ($1::text[]))`,
		args: func(s SignalScope) []any { return []any{stringArray(s.WorkerKeys)} }}
}

// SQLSignal is a custom signal: query, run with args in a read
// transaction, returns one value, a number or a boolean (true is 1,
// false 0; NULL and no row are 0). Name is the signal's name. Example:
// SQLSignal("orders_queue", `SELECT count(*) FROM jobs WHERE state = $1`, "queued").
func SQLSignal(name, query string, args ...any) Signal {
	return sqlSignal{SignalName: name, query: query, args: func(SignalScope) []any { return args }}
}

// ProbeLatencySignal runs query (no parameters, in a transaction of its
// own) at each reading, times that transaction from BEGIN to the end of its
// COMMIT (a query that writes, such as one of the application's updates,
// includes its commit's WAL flush, as the application's latency does), and
// returns the given percentile (in (0, 100], e.g. 95 or 99) of the
// latencies of the readings within window, in milliseconds (nearest rank).
// A probe still running when the reading's deadline (one
// backfill.Config.ThrottleInterval) ends counts as having taken that long;
// a probe that fails is an error (the throttle keeps its state, the failure
// is logged). Name "probe_latency". Set High to the application's latency
// alone plus a margin (e.g. its p99 plus 30%).
func ProbeLatencySignal(query string, percentile float64, window time.Duration) Signal {
	return &probe{query: query, pct: percentile, win: LatencyWindow{Span: window}}
}

type probe struct {
	query string
	pct   float64
	mu    sync.Mutex
	win   LatencyWindow
}

func (p *probe) Name() string { return "probe_latency" }

func (p *probe) Read(ctx context.Context, db sqlx.ExtContext, _ SignalScope) (float64, error) {
	switch {
	case !(p.pct > 0 && p.pct <= 100):
		return 0, fmt.Errorf("%w: ProbeLatencySignal: percentile %v is not in (0, 100]", backfilltype.ErrInvalidConfig, p.pct)
	case p.win.Span <= 0:
		return 0, fmt.Errorf("%w: ProbeLatencySignal: window %v is not positive", backfilltype.ErrInvalidConfig, p.win.Span)
	}
	took, err := timeProbe(ctx, db, p.query)
	if err != nil {
		return 0, fmt.Errorf("backfill: signal probe_latency: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.win.Add(now, took)
	return float64(p.win.Percentile(now, p.pct)) / float64(time.Millisecond), nil
}

// timeProbe runs query in a transaction of its own and returns how long
// that transaction took, from BEGIN to the end of its COMMIT. A probe cut
// off by ctx's deadline took at least until the deadline: a sample, not
// an error. A probe that fails otherwise is an error.
func timeProbe(ctx context.Context, db sqlx.ExtContext, query string) (time.Duration, error) {
	// Timed from BEGIN to COMMIT, as an application's transaction is: a
	// probe that writes waits for its commit's WAL flush
	// (synchronous_commit), often the larger part of its latency.
	start := time.Now()
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows, err := tx.QueryContext(ctx, query)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		return err
	})
	took := time.Since(start)
	if err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// A probe that fails (or a call that ends) measures nothing.
		return 0, err
	}
	// A probe cut off by the reading's deadline (one throttle
	// interval) took at least that long: a sample.
	if err != nil {
		if dl, ok := ctx.Deadline(); ok {
			took = max(took, dl.Sub(start))
		}
	}
	return took, nil
}

// LatencyWindow keeps the latencies measured within Span of now. It is
// not safe for concurrent use.
type LatencyWindow struct {
	// Span is how long a sample stays in the window; samples older than
	// Span are dropped when the window is added to or read.
	Span    time.Duration `json:"-" db:"-"`
	at      []time.Time
	samples []time.Duration
}

// Add records latency d measured at now, and drops the samples more
// than Span older than now. Calls must come in order of now.
func (w *LatencyWindow) Add(now time.Time, d time.Duration) {
	w.at = append(w.at, now)
	w.samples = append(w.samples, d)
	w.expire(now)
}

func (w *LatencyWindow) expire(now time.Time) {
	i := 0
	for i < len(w.at) && now.Sub(w.at[i]) > w.Span {
		i++
	}
	w.at, w.samples = w.at[i:], w.samples[i:]
}

// Percentile returns the p-th percentile (nearest rank) of the samples
// within the window, 0 for none.
func (w *LatencyWindow) Percentile(now time.Time, p float64) time.Duration {
	w.expire(now)
	return Percentile(w.samples, p)
}

// Percentile is the nearest-rank p-th percentile of samples: the
// smallest sample such that at least p% of the samples are at most it.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// stringArray is a text[] bind value.
func stringArray(ss []string) any {
	if ss == nil {
		ss = []string{}
	}
	return pq.StringArray(ss)
}
