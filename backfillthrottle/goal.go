package backfillthrottle

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/quote"
)

// Calibrator is a [Signal] that measures its own baseline while the
// backfill is held. After each reading, backfill.Runner.Run asks
// Calibrating: while it is true the call claims no chunk (chunks in
// progress finish), the reading is not compared with the throttle's
// watermarks, and the time is recorded as a throttle period of the
// signal ("calibrating"). [LatencyGoal]'s signal implements it.
type Calibrator interface {
	Signal
	// Calibrating reports whether the signal is measuring its baseline
	// and needs the backfill held, as of its latest reading.
	Calibrating() bool
}

// GoalSource is what [LatencyGoal] measures.
type GoalSource int

const (
	// SourceAuto reads the probe query, or without one
	// pg_stat_statements. The probe is preferred: pg_stat_statements
	// times a COMMIT before the commit itself runs, so the statements'
	// time does not include their WAL flush, where a backfill's WAL
	// costs an application most (their lock waits behind other
	// transactions' flushes are in it).
	SourceAuto GoalSource = iota
	// SourceStatements reads the application's own statements in
	// pg_stat_statements (PostgreSQL 13 or later): the mean execution
	// time of the statements run since the last reading, by every role
	// but the Runner's own (or by GoalOptions.Roles). The backfill should
	// then run as a role of its own. With track_utility on (the default)
	// an application's COMMIT statements count, but not the commit's WAL
	// flush, which runs after the statement.
	SourceStatements
	// SourceProbe times the probe query, on the server: from before its
	// BEGIN to after its COMMIT, in one message of several statements
	// (the network and the client's own process, busy with the
	// backfill, are not in it). It sets the session setting
	// backfill.probe_started on the connection it used.
	SourceProbe
)

func (s GoalSource) String() string {
	switch s {
	case SourceStatements:
		return "pg_stat_statements"
	case SourceProbe:
		return "probe"
	}
	return "auto"
}

// ChunkAdvisor is a [Signal] that suggests how long a chunk's
// transaction should last while its throttle watches the run: a chunk
// writes its WAL in a burst (its merge), which every commit of the
// application in the meantime waits to flush, so under a latency goal
// smaller chunks, spaced evenly by the rate, cost the application's tail
// less than fewer large ones at the same rows per second. Chunk sizing
// that adapts toward a target duration may take the smallest suggestion
// of the run's throttles as the target's ceiling. [LatencyGoal]'s signal
// implements it.
type ChunkAdvisor interface {
	Signal
	// ChunkDuration is the longest chunk transaction suggested; 0: no
	// suggestion.
	ChunkDuration() time.Duration
}

// GoalOptions tunes [LatencyGoal]; its zero value is the recommended
// setting.
type GoalOptions struct {
	// Source is what is measured. Default SourceAuto: the probe, or the
	// application's statements when there is no probe query.
	Source GoalSource
	// Roles are the application's roles, whose statements
	// SourceStatements reads. Default: every role but the Runner's.
	Roles []string
	// Percentile is the probe's statistic, in (0, 100]: the nearest-rank
	// percentile of its latencies over Window, compared with the same
	// percentile measured while the backfill is held. Default 90: at 4
	// probes every 250 ms a window holds about 80 probes, enough for a
	// p90 (a p99 of 80 probes is their maximum, which moves with the
	// probe's own outliers). The statements' statistic is their mean execution time
	// over Window (pg_stat_statements keeps no percentiles).
	Percentile float64
	// Window is how long a sample counts. Default 5 s. It must be
	// several ThrottleIntervals: a reading after none for a Window is
	// taken for a new call of Run, which calibrates again.
	Window time.Duration
	// Samples is how many probes each reading runs, one after another,
	// each in a transaction of its own (a reading stops early once half
	// its deadline, one ThrottleInterval, has passed). Default 4: with
	// a ThrottleInterval of 250 ms, 16 probes a second, 80 in the
	// default Window.
	Samples int
	// Calibrate is how long the backfill is held while the baseline is
	// measured: when the call starts, and at every recalibration. The
	// baseline takes at least 10 probes, so a calibration lasts longer
	// when the probes are slow. Default 10 s.
	Calibrate time.Duration
	// Settle is how long a recalibration waits, once the backfill is
	// held, before it counts the probes (the backfill's chunks in
	// flight finish, its WAL is flushed). Default 2 s. The calibration
	// when the call starts does not wait.
	Settle time.Duration
	// ChunkDuration is what the signal suggests as the longest chunk
	// transaction ([ChunkAdvisor]). Default 250 ms; negative: none.
	ChunkDuration time.Duration
	// Recalibrate is how often the baseline is measured again, from
	// the end of the previous calibration (the application's own load
	// changes). Default 5 min; negative: never.
	Recalibrate time.Duration
}

// GoalSignalName is the name of [LatencyGoal]'s signal, in logs, throttle
// periods and knobs (throttle.latency_goal.high).
const GoalSignalName = "latency_goal"

// LatencyGoal returns an adaptive [Throttle] that keeps the
// application's latency within rise of its latency without the backfill:
// rise 0.3 lets it grow by 30 %. The user states the goal; the throttle
// measures the baseline itself, comparing like with like (the same
// statistic of the same source, without the backfill and with it).
//
// The source ([GoalOptions.Source]) is query, a transaction like the
// application's (no parameters; it may be several statements), run in a
// transaction of its own and timed on the server from before its BEGIN
// to after its COMMIT, WAL flush included (the o.Percentile of its
// latencies). With query "" it is the application's own statements in
// pg_stat_statements (their mean execution time), which must then be
// installed and readable in the Runner's database.
//
// Its signal (name [GoalSignalName], a [Calibrator]) holds the backfill
// for o.Calibrate when the call starts (and again every o.Recalibrate),
// measures the statistic over that time (the baseline), then reads the
// same statistic over the last o.Window, with the backfill, divided by
// the baseline: 1 is the latency alone. The throttle is [Throttle.Adapt]
// (AIMD on the rows per second) with High 1 + rise, Low 1 + rise/3 and
// MinHold o.Window: a window above High halves the rate, once per
// window; below Low the rate is given back step by step. Its fields may
// be changed before use (e.g. Critical).
//
// A probe reading runs o.Samples probes one after another, each on a
// connection of the Runner's pool (the query must not begin or end
// transactions of its own). The signal keeps its state between readings: a reading after
// none for o.Window (a later call of backfill.Runner.Run) calibrates
// again. The baseline is per call of backfill.Runner.Run: with several
// processes on one job, a process that calibrates while another one
// backfills measures a baseline with that backfill in it (looser than
// rise).
//
// It returns an error wrapping [backfilltype.ErrInvalidConfig] when
// rise is not a positive finite number, query is empty with SourceProbe,
// or an option is out of range (Percentile outside (0, 100], a negative
// duration or Samples, an unknown Source). The first reading fails the
// call of backfill.Runner.Run with such an error when the source cannot
// be read: SourceStatements without a readable pg_stat_statements, or
// SourceAuto without one and without a query.
func LatencyGoal(query string, rise float64, o GoalOptions) (Throttle, error) {
	bad := func(format string, args ...any) (Throttle, error) {
		return Throttle{}, fmt.Errorf("%w: LatencyGoal: "+format, append([]any{backfilltype.ErrInvalidConfig}, args...)...)
	}
	switch {
	case query == "" && o.Source == SourceProbe:
		return bad("query is required with SourceProbe")
	case o.Source < SourceAuto || o.Source > SourceProbe:
		return bad("unknown Source %d", o.Source)
	case !(rise > 0) || math.IsInf(rise, 0):
		return bad("rise %v is not a positive number (0.3: the latency may rise 30 %%)", rise)
	case o.Percentile != 0 && !(o.Percentile > 0 && o.Percentile <= 100):
		return bad("Percentile %v is not in (0, 100]", o.Percentile)
	case o.Window < 0, o.Calibrate < 0, o.Settle < 0:
		return bad("Window, Calibrate and Settle cannot be less than zero")
	case o.Samples < 0:
		return bad("Samples cannot be less than zero")
	case controlsTransaction(query):
		return bad("query %q begins or ends a transaction: the probe runs it inside one of its own", query)
	}
	o = o.withDefaults()
	s := &goalSignal{query: query, samples: o.Samples, source: o.Source, roles: o.Roles, st: newGoalState(o, false)}
	return Throttle{Signal: s, High: 1 + rise, Low: 1 + rise/3, MinHold: o.Window, Adapt: true}, nil
}

func (o GoalOptions) withDefaults() GoalOptions {
	if o.Percentile == 0 {
		o.Percentile = 90
	}
	if o.Window == 0 {
		o.Window = 5 * time.Second
	}
	if o.Samples == 0 {
		o.Samples = 4
	}
	if o.Calibrate == 0 {
		o.Calibrate = 10 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = 2 * time.Second
	}
	if o.ChunkDuration == 0 {
		o.ChunkDuration = 250 * time.Millisecond
	}
	if o.Recalibrate == 0 {
		o.Recalibrate = 5 * time.Minute
	}
	return o
}

type goalSignal struct {
	query   string
	samples int
	source  GoalSource
	roles   []string
	mu      sync.Mutex
	st      *goalState
	// chosen is the source in use, settled at the first reading;
	// statsView the quoted pg_stat_statements view; last the totals of
	// its previous reading (calls, ms), had whether there is one.
	chosen    GoalSource
	statsView string
	last      [2]float64
	had       bool
}

func (g *goalSignal) Name() string { return GoalSignalName }

// Calibrating implements [Calibrator].
func (g *goalSignal) Calibrating() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.calibrating
}

// Baseline is the latency the signal last calibrated (0 before its
// first calibration ends): the probe's percentile, or the application's
// mean statement time.
func (g *goalSignal) Baseline() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.baseline
}

// ChunkDuration implements [ChunkAdvisor].
func (g *goalSignal) ChunkDuration() time.Duration { return max(g.st.o.ChunkDuration, 0) }

// Source is the source the signal reads ([SourceAuto] before its first
// reading).
func (g *goalSignal) Source() GoalSource {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.chosen
}

// Read takes the reading's samples (the probes, or the application's
// statements since the last reading) and returns the ratio of the
// window's statistic to the baseline; 0 while calibrating.
func (g *goalSignal) Read(ctx context.Context, db sqlx.ExtContext, _ SignalScope) (float64, error) {
	g.mu.Lock()
	chosen := g.chosen
	g.mu.Unlock()
	if chosen == SourceAuto {
		var err error
		if chosen, err = g.choose(ctx, db); err != nil {
			return 0, err
		}
	}
	var took []sample
	var err error
	if chosen == SourceStatements {
		took, err = g.readStatements(ctx, db)
	} else {
		took, err = g.probe(ctx, db)
	}
	if err != nil {
		return 0, fmt.Errorf("backfill: signal %s: %w", GoalSignalName, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.observe(time.Now(), took), nil
}

// choose settles the source at the first reading: pg_stat_statements
// when it is installed in the database and readable (SourceAuto,
// SourceStatements), else the probe.
func (g *goalSignal) choose(ctx context.Context, db sqlx.ExtContext) (GoalSource, error) {
	chosen := SourceProbe
	// Auto reads the statements only without a probe: their time does
	// not include their commit's WAL flush, the backfill's main cost to
	// an application (see SourceAuto).
	if g.source == SourceStatements || g.source == SourceAuto && g.query == "" {
		var schema []string
		err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			schema = schema[:0]
			return sqlx.SelectContext(ctx, tx, &schema, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_stat_statements'`)
		})
		var why error
		switch {
		case err != nil:
			why = err
		case len(schema) == 0:
			why = errors.New("the extension pg_stat_statements is not installed in this database (CREATE EXTENSION pg_stat_statements)")
		default:
			g.statsView = quote.SQLIdent(schema[0]) + ".pg_stat_statements"
			if _, why = g.statementTotals(ctx, db); why == nil {
				chosen = SourceStatements
			}
		}
		switch {
		case why != nil && g.source == SourceStatements:
			return 0, fmt.Errorf("%w: signal %s: pg_stat_statements cannot be read: %w", backfilltype.ErrInvalidConfig, GoalSignalName, why)
		case why != nil && g.query == "":
			return 0, fmt.Errorf("%w: signal %s: no probe query, and pg_stat_statements cannot be read: %w", backfilltype.ErrInvalidConfig, GoalSignalName, why)
		}
	}
	g.mu.Lock()
	g.chosen = chosen
	g.st.mean = chosen == SourceStatements
	g.mu.Unlock()
	return chosen, nil
}

// statementTotals reads the calls and total execution time (ms) of the
// application's statements in this database: those of g.roles, or of
// every role but the Runner's own.
func (g *goalSignal) statementTotals(ctx context.Context, db sqlx.ExtContext) ([2]float64, error) {
	var t struct {
		Calls float64 `db:"calls"`
		MS    float64 `db:"ms"`
	}
	err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &t, `SELECT coalesce(sum(s.calls), 0)::float8 AS calls, coalesce(sum(s.total_exec_time), 0)::float8 AS ms
			FROM `+g.statsView+` s
			WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND CASE WHEN cardinality($1::text[]) = 0 THEN s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
					ELSE s.userid IN (SELECT oid FROM pg_roles WHERE rolname = ANY ($1::text[])) END`, stringArray(g.roles))
	})
	return [2]float64{t.Calls, t.MS}, err
}

// readStatements is one sample: the application's statements since the
// previous reading, their total time over their number. None at the
// first reading, and none when the statistics were reset or evicted
// meanwhile (a total went down).
func (g *goalSignal) readStatements(ctx context.Context, db sqlx.ExtContext) ([]sample, error) {
	now, err := g.statementTotals(ctx, db)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	prev, had := g.last, g.had
	g.last, g.had = now, true
	calls, ms := now[0]-prev[0], now[1]-prev[1]
	if !had || calls <= 0 || ms < 0 {
		return nil, nil
	}
	return []sample{{d: time.Duration(ms * float64(time.Millisecond)), n: calls}}, nil
}

// probe runs the reading's probes, one after another, until half the
// reading's deadline has passed.
func (g *goalSignal) probe(ctx context.Context, db sqlx.ExtContext) ([]sample, error) {
	start := time.Now()
	budget := time.Duration(math.MaxInt64)
	if dl, ok := ctx.Deadline(); ok {
		budget = dl.Sub(start) / 2
	}
	var took []sample
	for i := 0; i < g.samples && (i == 0 || time.Since(start) < budget); i++ {
		d, err := timeProbeServer(ctx, db, g.query)
		if err != nil {
			if len(took) > 0 {
				break // a later probe cut by the end of the call: keep the others
			}
			return nil, err
		}
		took = append(took, sample{d: d, n: 1})
	}
	return took, nil
}

// serverTimedSQL runs a probe (%s) in a transaction of its own and
// returns how long the server took from before its BEGIN to after its
// COMMIT (the WAL flush included), in microseconds: one message of
// several statements, so the time of the network and of the client's
// own process (a backfill busy on the same CPUs) is not in it.
const serverTimedSQL = `SELECT set_config('backfill.probe_started', clock_timestamp()::text, false);
BEGIN;
%s;
COMMIT;
SELECT (extract(epoch FROM clock_timestamp() - current_setting('backfill.probe_started')::timestamptz) * 1e6)::float8`

// timeProbeServer times query as serverTimedSQL does, on a connection
// of its own from db's pool; a failed probe discards its connection (it
// may be left in the probe's transaction). Without a pool of connections
// (db has no Connx) it times the probe from the client ([timeProbe]). A
// probe cut off by ctx's deadline took at least until the deadline.
func timeProbeServer(ctx context.Context, db sqlx.ExtContext, query string) (time.Duration, error) {
	c, ok := db.(interface {
		Connx(context.Context) (*sqlx.Conn, error)
	})
	if !ok {
		return timeProbe(ctx, db, query)
	}
	start := time.Now()
	conn, err := c.Connx(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	us, err := lastValue(ctx, conn, fmt.Sprintf(serverTimedSQL, query))
	if err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // not back to the pool
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			if dl, ok := ctx.Deadline(); ok {
				return max(time.Since(start), dl.Sub(start)), nil
			}
		}
		return 0, err
	}
	return time.Duration(us * float64(time.Microsecond)), nil
}

// lastValue runs query (several statements) and returns the first value
// of the last row of its last result, a number.
func lastValue(ctx context.Context, conn *sqlx.Conn, query string) (float64, error) {
	rows, err := conn.QueryContext(ctx, query)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var last any
	for {
		cols, err := rows.Columns()
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				return 0, err
			}
			if len(vals) > 0 {
				last = vals[0]
			}
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if v, ok := last.(float64); ok {
		return v, nil
	}
	return 0, fmt.Errorf("the probe's timing read %v (%T), not a number", last, last)
}

// sample is what a reading measured: one probe's latency (n 1), or the
// total time d of n of the application's statements.
type sample struct {
	at time.Time
	d  time.Duration
	n  float64
}

// goalState is the pure part of [LatencyGoal]'s signal: the calibration
// schedule, the baseline and the window. The caller gives the time.
type goalState struct {
	o           GoalOptions
	mean        bool // the statistic: total time over count (statements), else the percentile
	calibrating bool
	started     bool
	last        time.Time // the latest reading
	calFrom     time.Time // when the current calibration's samples count
	calUntil    time.Time // its earliest end
	calSamples  []sample
	calibrated  time.Time // when the last calibration ended
	baseline    time.Duration
	win         []sample // oldest first
}

// minCalibration is the least count (probes or statements) a baseline is
// computed from: a calibration lasts until it has them.
const minCalibration = 10

// baselineFloor keeps the ratio finite for a probe that takes no time.
const baselineFloor = time.Microsecond

func newGoalState(o GoalOptions, mean bool) *goalState {
	return &goalState{o: o, mean: mean}
}

// stat is the statistic of samples: the mean of the statements' time,
// or the percentile of the probes; 0 for none.
func (s *goalState) stat(ss []sample) time.Duration {
	if s.mean {
		var d, n float64
		for _, x := range ss {
			d += float64(x.d)
			n += x.n
		}
		if n == 0 {
			return 0
		}
		return time.Duration(d / n)
	}
	ds := make([]time.Duration, len(ss))
	for i, x := range ss {
		ds[i] = x.d
	}
	return Percentile(ds, s.o.Percentile)
}

func count(ss []sample) float64 {
	n := 0.0
	for _, x := range ss {
		n += x.n
	}
	return n
}

// observe records the samples of a reading taken at now and returns the
// signal's value: 0 while calibrating (then calibrating is true), else
// the window's statistic over the baseline (1 while the window is
// empty).
func (s *goalState) observe(now time.Time, took []sample) float64 {
	if !s.started || now.Sub(s.last) > s.o.Window {
		// The first reading, before the call claims anything, or the
		// first of a later call of Run (no reading for a window): the
		// backfill is not running, nothing to settle.
		s.started = true
		s.begin(now, 0)
	} else if !s.calibrating && s.o.Recalibrate > 0 && now.Sub(s.calibrated) >= s.o.Recalibrate {
		s.begin(now, s.o.Settle)
	}
	s.last = now
	for i := range took {
		took[i].at = now
	}
	if s.calibrating {
		if !now.Before(s.calFrom) {
			s.calSamples = append(s.calSamples, took...)
		}
		if now.Before(s.calUntil) || count(s.calSamples) < minCalibration {
			return 0
		}
		s.baseline = max(s.stat(s.calSamples), baselineFloor)
		s.calibrating, s.calibrated = false, now
		// The window compares like with like: only samples taken
		// with the backfill allowed count from here on.
		s.win = s.win[:0]
		return 1
	}
	s.win = append(s.win, took...)
	i := 0
	for i < len(s.win) && now.Sub(s.win[i].at) > s.o.Window {
		i++
	}
	s.win = s.win[i:]
	v := s.stat(s.win)
	if v == 0 || now.Sub(s.calibrated) < s.o.Window/2 {
		// Half a window after a calibration at least: a few probes are
		// no statistic, and the backfill, just released, is still
		// reaching its pace (an adaptive throttle's first cut takes
		// the rate read before it as the ceiling).
		return 1
	}
	return float64(v) / float64(s.baseline)
}

// begin starts a calibration at now whose samples count after settle.
func (s *goalState) begin(now time.Time, settle time.Duration) {
	s.calibrating = true
	s.calFrom = now.Add(settle)
	s.calUntil = s.calFrom.Add(s.o.Calibrate)
	s.calSamples = s.calSamples[:0]
}

// controlsTransaction reports whether one of query's statements (split at
// semicolons) is a transaction control statement.
func controlsTransaction(query string) bool {
	for _, st := range strings.Split(query, ";") {
		f := strings.Fields(strings.ToLower(st))
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release", "prepare":
			return true
		}
	}
	return false
}
