package backfillthrottle

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"slices"
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
	// percentile over windows of the same length measured while the
	// backfill is held. Default 95: at 8 probes every 250 ms a window
	// holds about 160 probes, and their p95 is the 8th slowest, which
	// rises once a few percent of the application's transactions wait
	// behind the backfill (a p90 rises only at a tenth of them, when the
	// application's p99 has long risen), and moves less with the probe's
	// own outliers than their p99 (the 2nd slowest). The statements'
	// statistic is their mean execution time over Window
	// (pg_stat_statements keeps no percentiles).
	Percentile float64
	// Window is how long a sample counts, and how long each calibration
	// window lasts. Default 5 s. It must be several ThrottleIntervals: a
	// reading after none for a Window is taken for a new call of Run,
	// which calibrates again.
	Window time.Duration
	// Samples is how many probes each reading runs, one after another,
	// each in a transaction of its own (a reading stops early once half
	// its deadline, one ThrottleInterval, has passed). Default 8: with
	// a ThrottleInterval of 250 ms, 32 probes a second, 160 in the
	// default Window.
	Samples int
	// Calibrate is how long the backfill is held when the call starts,
	// while the baseline is first measured, in windows of Window (Calibrate
	// over Window of them, at least one; one window of Calibrate when it
	// is shorter than Window). A window lasts until it has at least 10
	// probes. Default 15 s: three windows, whose median is the first
	// baseline.
	Calibrate time.Duration
	// Settle is how long a recalibration waits, once the backfill is
	// held, before it counts the probes (the backfill's chunks in
	// flight finish, its WAL is flushed). Default 1 s. The calibration
	// when the call starts does not wait.
	Settle time.Duration
	// ChunkDuration is what the signal suggests as the longest chunk
	// transaction ([ChunkAdvisor]). Default 250 ms; negative: none.
	ChunkDuration time.Duration
	// Recalibrate is how often one more calibration window is measured,
	// the backfill held for Settle and one Window, from the end of the
	// previous calibration; the baseline is the median of the last 5
	// windows measured. Default 2 min (5 % of the run held); negative:
	// only when the call starts, and on drift (see [LatencyGoal]).
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
// for o.Calibrate when the call starts and measures the statistic over
// windows of o.Window without the backfill; the baseline is the median
// of the last 5 such windows. Then it reads the same statistic over the
// last o.Window, with the backfill, divided by the baseline: 1 is the
// latency alone. Every o.Recalibrate it holds the backfill again for
// o.Settle and one window, which joins the baseline's median. It also
// recalibrates early when its readings stay at or above 1 + rise, or at
// or below 1/(1 + rise), for 3 windows (the latency moved and the rate
// did not explain it), and a calibration that reads the application
// alone outside that band around the baseline is measured for one more
// window and, if that one is outside it too, on the same side, replaces
// the baseline (the load changed without the backfill). The throttle is [Throttle.Adapt] (AIMD on the
// rows per second) with High 1 + rise, Low 1 + rise/3 and MinHold
// o.Window: a window above High halves the rate, once per window; below
// Low the rate is given back step by step. Its fields may be changed
// before use (e.g. Critical).
//
// A chunk's commit flushes its WAL at once, and every commit of the
// application meanwhile waits for it: pair the goal with
// backfill.Config.ChunkTarget (adaptive chunks, e.g. 50 ms) so that each
// commit is small, and the rate the throttle sets spaces small commits
// rather than a few large ones.
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
	s := &goalSignal{query: query, samples: o.Samples, source: o.Source, roles: o.Roles, st: newGoalState(o, rise, false)}
	return Throttle{Signal: s, High: 1 + rise, Low: 1 + rise/3, MinHold: o.Window, Adapt: true}, nil
}

func (o GoalOptions) withDefaults() GoalOptions {
	if o.Percentile == 0 {
		o.Percentile = 95
	}
	if o.Window == 0 {
		o.Window = 5 * time.Second
	}
	if o.Samples == 0 {
		o.Samples = 8
	}
	if o.Calibrate == 0 {
		o.Calibrate = 15 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = time.Second
	}
	if o.ChunkDuration == 0 {
		o.ChunkDuration = 250 * time.Millisecond
	}
	if o.Recalibrate == 0 {
		o.Recalibrate = 2 * time.Minute
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
//
// The baseline is the median of the statistics of the last
// baselineHistory calibration windows, each as long as the window the
// backfill is then compared over (o.Window, or o.Calibrate when that is
// shorter) and of the same statistic: one calibration window read in a
// quiet or a busy moment of a loaded server moves the median less than
// it moved a single baseline. A call's first calibration holds the
// backfill for o.Calibrate, several windows; each recalibration (every
// o.Recalibrate, or early on drift, below) holds it for o.Settle and one
// window, whose statistic joins the history.
//
// Drift. A calibration whose median is outside the goal's band around
// the baseline ([baseline/band, baseline×band], band 1 + rise) measured
// the application alone at a latency the goal would call a change: the
// load changed without the backfill. It is measured again for one more
// window (the hold goes on); if the median of its windows is still
// outside the band on the same side, the history is replaced by its
// windows (the new load), else they join it. Readings (with the backfill) that stay at or
// above band, or at or below 1/band, for driftAfter windows start a
// recalibration early: above, the rate has been halved that many times
// already and the latency did not come down, so the backfill is not what
// raised it; below, the baseline was read in a busy moment.
type goalState struct {
	o           GoalOptions
	band        float64 // 1 + rise
	mean        bool    // the statistic: total time over count (statements), else the percentile
	calibrating bool
	started     bool
	last        time.Time // the latest reading
	// The calibration in progress: the current window's samples count
	// from calFrom; calWindows windows are wanted (one more when drift is
	// suspected: extended), calStats are those measured so far.
	calFrom    time.Time
	calWindows int
	calSamples []sample
	calStats   []time.Duration
	extended   bool
	calibrated time.Time       // when the last calibration ended
	history    []time.Duration // the last calibration windows' statistics, oldest first
	baseline   time.Duration
	win        []sample // oldest first
	// The readings' side of the band (+1 at or above band, -1 at or
	// below 1/band, 0 within) and since when they are on it.
	drift      int
	driftSince time.Time
}

// minCalibration is the least count (probes or statements) a calibration
// window's statistic is computed from: a window lasts until it has them.
const minCalibration = 10

// baselineHistory is how many calibration windows the baseline is the
// median of.
const baselineHistory = 5

// driftAfter is how many windows of readings outside the band start a
// recalibration early.
const driftAfter = 3

// baselineFloor keeps the ratio finite for a probe that takes no time.
const baselineFloor = time.Microsecond

func newGoalState(o GoalOptions, rise float64, mean bool) *goalState {
	return &goalState{o: o, band: 1 + rise, mean: mean}
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

// median is the median of ds (the mean of the middle two for an even
// count); 0 for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// calWindow is the length of a calibration window: the comparison's
// window, or the whole calibration when that is shorter.
func (s *goalState) calWindow() time.Duration { return min(s.o.Window, s.o.Calibrate) }

// observe records the samples of a reading taken at now and returns the
// signal's value: 0 while calibrating (then calibrating is true), else
// the window's statistic over the baseline (1 while the window is
// empty, and for half a window after a calibration).
func (s *goalState) observe(now time.Time, took []sample) float64 {
	switch {
	case !s.started || now.Sub(s.last) > s.o.Window:
		// The first reading, before the call claims anything, or the
		// first of a later call of Run (no reading for a window): the
		// backfill is not running, nothing to settle. A new call
		// measures its own baseline.
		s.started = true
		s.history = s.history[:0]
		s.begin(now, 0, max(int(math.Round(float64(s.o.Calibrate)/float64(s.calWindow()))), 1))
	case s.calibrating:
	case s.o.Recalibrate > 0 && now.Sub(s.calibrated) >= s.o.Recalibrate,
		s.drift != 0 && now.Sub(s.driftSince) >= driftAfter*s.o.Window:
		s.begin(now, s.o.Settle, 1)
	}
	s.last = now
	for i := range took {
		took[i].at = now
	}
	if s.calibrating {
		return s.calibrate(now, took)
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
	r := float64(v) / float64(s.baseline)
	side := 0
	switch {
	case r >= s.band:
		side = 1
	case r <= 1/s.band:
		side = -1
	}
	if side != s.drift {
		s.drift, s.driftSince = side, now
	}
	return r
}

// calibrate takes a reading's samples while calibrating and returns 0,
// or 1 when the calibration ends with it. A calibration window is
// [calFrom, calFrom + calWindow), extended until it holds minCalibration
// samples; the reading that closes it starts the next one (its samples
// are dropped when it ends the calibration: the backfill is released).
func (s *goalState) calibrate(now time.Time, took []sample) float64 {
	if now.Before(s.calFrom) {
		return 0 // settling
	}
	if now.Sub(s.calFrom) < s.calWindow() || count(s.calSamples) < minCalibration {
		s.calSamples = append(s.calSamples, took...)
		return 0
	}
	s.calStats = append(s.calStats, max(s.stat(s.calSamples), baselineFloor))
	s.calSamples, s.calFrom = append(s.calSamples[:0], took...), now
	if len(s.calStats) < s.calWindows {
		return 0
	}
	last := s.calStats[len(s.calStats)-1]
	switch {
	case len(s.history) == 0:
		s.history = append(s.history, s.calStats...)
	case !s.extended && !s.inBand(median(s.calStats)):
		// The application alone, outside the band: measure one more
		// window before calling it a change of load.
		s.extended = true
		s.calWindows++
		return 0
	case s.extended && s.side(last) != 0 && s.side(last) == s.side(s.calStats[0]):
		// Confirmed by a second window on the same side: the load
		// changed without the backfill; the old windows are no longer
		// the application alone.
		s.history = append(s.history[:0], s.calStats...)
	default:
		// Within the band, or one odd window: the median of the
		// history absorbs it.
		s.history = append(s.history, s.calStats...)
	}
	if n := len(s.history); n > baselineHistory {
		s.history = append(s.history[:0], s.history[n-baselineHistory:]...)
	}
	s.baseline = median(s.history)
	s.calibrating, s.calibrated = false, now
	s.drift = 0
	// The window compares like with like: only samples taken with the
	// backfill allowed count from here on.
	s.win = s.win[:0]
	return 1
}

// inBand reports whether d is within the goal's band around the baseline.
func (s *goalState) inBand(d time.Duration) bool { return s.side(d) == 0 }

// side is +1 when d is above the goal's band around the baseline, -1
// below it, 0 within it.
func (s *goalState) side(d time.Duration) int {
	switch {
	case float64(d) > float64(s.baseline)*s.band:
		return 1
	case float64(d)*s.band < float64(s.baseline):
		return -1
	}
	return 0
}

// begin starts a calibration at now of windows windows, whose samples
// count after settle.
func (s *goalState) begin(now time.Time, settle time.Duration, windows int) {
	s.calibrating = true
	s.calFrom = now.Add(settle)
	s.calWindows, s.extended = windows, false
	s.calSamples, s.calStats = s.calSamples[:0], s.calStats[:0]
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
