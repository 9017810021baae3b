package backfilltype

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/pgbackfill/backfill/internal/textcap"
)

// ControlState is what the workers of a run read of its control: the
// run's status (with the reason of a pause or cancel) and its live knobs,
// by name ("concurrency", ...: the knobs of backfill.PGManifest.SetKnob).
type ControlState struct {
	Status RunStatus
	Reason string
	Knobs  map[string]float64
}

// Status is a run's progress as the manifest records it, readable from any
// process (backfill.PGManifest.Status, backfill.Runner.Status; the
// run_progress view in SQL). Seconds are float64 seconds of the server's
// clock; rates are rows per second. Fields a run cannot give yet (a rate
// before the first checkpoint) are nil.
type Status struct {
	BatchID int64     `json:"batch_id"`
	Job     string    `json:"job"`
	Status  RunStatus `json:"status"`
	// Liveness is backfill.LivenessRunning, backfill.LivenessStalled or
	// backfill.LivenessDead for a running run, else its status
	// ([RunLiveness]).
	Liveness      string     `json:"liveness"`
	LiveWorkers   int        `json:"live_workers"`
	LastHeartbeat *time.Time `json:"last_heartbeat,omitempty"`
	// CreatedAt is when the run was created; AsOf the end of the time
	// measured: now for a running or paused run, else when it ended.
	CreatedAt time.Time `json:"created_at"`
	AsOf      time.Time `json:"as_of"`
	// Chunks counts the plan's chunks by status.
	Chunks StatusChunks `json:"chunks"`
	// Rows sums the counts of the checkpointed (done or open) chunks, each
	// as it stands (backfill.Report.Counts), and of the committed
	// sub-chunks of the chunks worked in sub-chunks that are not done
	// yet (backfill.Config.ChunkTarget: a chunk in progress, or left
	// pending or failed midway), whose rows are in the target: they never decrease across
	// resumes and retries, except when an open chunk's re-read lowers one
	// of its counts ([Counts.Reread]: it found fewer rows than the earlier
	// read, or rows that read inserted or rejected now count otherwise) or
	// a rollback withdraws chunks. RowsProcessed never decreases.
	Rows Counts `json:"rows"`
	// RowsProcessed sums the rows of every checkpointed read of every
	// chunk, a re-read open chunk once per read, rolled back chunks
	// included, and the rows of the committed sub-chunks of chunks not
	// done (as Rows): the work done. It never decreases. ChunkReads counts
	// those reads.
	RowsProcessed int64 `json:"rows_processed"`
	ChunkReads    int64 `json:"chunk_reads"`
	// LastCheckpoint is the server's time of the latest checkpoint.
	LastCheckpoint *time.Time `json:"last_checkpoint,omitempty"`
	// Time splits the run's time, from CreatedAt to AsOf.
	Time StatusTime `json:"time"`
	// RecentRate is RowsProcessed of the chunks checkpointed within the
	// recent window (the last 20 seconds of wall time or the last 20
	// checkpoints, whichever reaches further back), and of the sub-chunks
	// of chunks not done committed within it, per working second
	// within it; nil under 1 s of working time or no
	// rows. WindowStart is where that window starts.
	RecentRate  *float64  `json:"recent_rate"`
	WindowStart time.Time `json:"window_start"`
	// OverallRate is RowsProcessed per working second of the whole run;
	// WallRate per second of its total time (throttled, paused and idle
	// included).
	OverallRate *float64 `json:"overall_rate"`
	WallRate    *float64 `json:"wall_rate"`
	// RemainingChunks counts the pending and failed chunks (a failed
	// chunk is read again when the run is resumed); RemainingRows
	// estimates their rows from the plan: each chunk's span (the seconds
	// of a time chunk, the keys of an int chunk) at the rows per span of
	// the checkpointed chunks (their rows as they stand), and a list
	// chunk (no span) at the mean rows of a checkpointed chunk. It
	// assumes the source's rows spread over the chunks' spans as over
	// those already read; a chunk in flight (leased) counts half done.
	// Nil before any chunk was checkpointed.
	RemainingChunks int      `json:"remaining_chunks"`
	RemainingRows   *float64 `json:"remaining_rows"`
	// ETASeconds is RemainingRows / ETARate: the time left if the run
	// goes on working at the rate it has under the knobs and throttles in
	// force now; 0 when no chunk remains; nil when unknown or when the run
	// is not working (Waiting says why). ETARate is the recent working
	// rate (OverallRate when RecentRate is nil) or, when a knob was set
	// within the recent window (a throttle's watermark, the rate cap, a
	// concurrency), the rate since the change, throttle holds included,
	// once it ran a second and committed rows (until then the rate
	// before, and ETABasis says so), lowered to what the live
	// knobs allow: the rows_per_second knob, the chunks_per_second knob
	// (at the remaining rows per chunk), and the concurrency and
	// job_concurrency knobs (in proportion, when they allow fewer chunks
	// at once than the recent window ran); ETABasis names what set it.
	// Future throttle holds and pauses are not foreseen (the time split
	// says how much of the run so far they took).
	ETASeconds *float64 `json:"eta_seconds"`
	ETARate    *float64 `json:"eta_rate"`
	ETABasis   string   `json:"eta_basis,omitempty"`
	// Waiting says what a run that is not working waits for, and how to
	// end the wait: paused (by whom, why, since when, and the SQL and CLI
	// ways to resume it), cancelled, failed, stalled or dead (no live worker: start
	// one), or held by a throttle in every live worker (which signals);
	// or, before anything else, a rollback of the whole batch that did
	// not finish (interrupted between its transactions: who started it,
	// why, how many chunks it rolled back, and how to finish it); else
	// empty while it works or once it is completed.
	Waiting string `json:"waiting,omitempty"`
	// Approval is the run's approval policy, author and approvals so far
	// (nil when its plan has no approval policy).
	Approval *ApprovalState `json:"approval,omitempty"`
	// InFlight lists the chunks being worked, oldest first.
	InFlight []ChunkInFlight `json:"in_flight"`
	// Exceptions counts the exception queue by reason and column, most
	// frequent first.
	Exceptions []ExceptionCount `json:"exceptions"`
	// ThrottleWarnings lists the run's throttle signals that guard
	// nothing (backfillthrottle.Observer: a replica lag signal on a server
	// with no replica), by signal name: each signal whose latest
	// [EventSignalInert] is not followed by an [EventSignalObserves].
	// Empty when every signal observes what it guards.
	ThrottleWarnings []ThrottleWarning `json:"throttle_warnings,omitempty"`
	// LockWaits lists the sessions of the run's live workers that wait
	// for a lock now (a chunk's transaction behind another session's
	// lock on the target, a manifest table), longest first, each with the
	// session that blocks it. Empty when none waits.
	LockWaits []LockWait `json:"lock_waits,omitempty"`
	// Forecast compares the run with the forecast of the latest
	// rehearsal of its job's plan recorded before the run was created
	// (backfill.Runner.Rehearse); nil for none.
	Forecast *ForecastCheck `json:"forecast,omitempty"`
}

// LockWait is a session of a worker waiting for a lock
// ([Status.LockWaits]), read from pg_stat_activity, pg_locks and
// pg_blocking_pids. PostgreSQL shows the wait of another role's session
// only to a member of pg_read_all_stats (or a superuser): an operator
// role without it sees no lock wait of the loader's sessions, and a
// blocker's query reads "<insufficient privilege>". A chunk between two
// tries of a lock wait (rolled back, pausing before the next) is not
// waiting at that moment: the HTML report lists every recorded wait.
type LockWait struct {
	// WorkerID, Host and PID name the waiting worker; BackendPID its
	// session.
	WorkerID   string `json:"worker_id"`
	Host       string `json:"host"`
	PID        int    `json:"pid"`
	BackendPID int    `json:"backend_pid"`
	// WaitEvent is the lock's kind (pg_stat_activity.wait_event:
	// relation, tuple, transactionid, advisory...); Seconds how long the
	// session has waited for it (pg_locks.waitstart), by the server's
	// clock.
	WaitEvent string  `json:"wait_event"`
	Seconds   float64 `json:"seconds"`
	// BlockerPID is the first session blocking it (0: none seen, the
	// lock just granted), with its application_name, user, state and
	// query (its first 200 characters).
	BlockerPID   int    `json:"blocker_pid"`
	BlockerApp   string `json:"blocker_app"`
	BlockerUser  string `json:"blocker_user"`
	BlockerState string `json:"blocker_state"`
	BlockerQuery string `json:"blocker_query"`
}

// ThrottleWarning is a throttle signal that guards nothing
// ([Status.ThrottleWarnings]).
type ThrottleWarning struct {
	// Signal is the signal's name (backfillthrottle.Signal.Name).
	Signal string `json:"signal"`
	// Why says what the signal cannot observe and what to do.
	Why string `json:"why"`
	// Since is when a worker found it (the server's time).
	Since time.Time `json:"since"`
}

// StatusChunks counts a run's chunks by [ChunkStatus].
type StatusChunks struct {
	Total   int `json:"total"`
	Done    int `json:"done"`
	Open    int `json:"open"`
	Pending int `json:"pending"`
	Failed  int `json:"failed"`
	// Staged chunks wait for the publish at the end of the run.
	Staged     int `json:"staged"`
	RolledBack int `json:"rolled_back"`
	// Other counts chunks in a status this version does not know.
	Other int `json:"other"`
	// InFlight counts the pending or open chunks leased by a worker.
	InFlight int `json:"in_flight"`
	// Skipped counts the done chunks whose staging and merge were
	// skipped, their rows unchanged since the load they were compared
	// with (backfill.Job.SkipUnchanged, [ChunkState.Skipped]); they are among
	// Done.
	Skipped int `json:"skipped"`
}

// StatusTime splits a run's time in seconds: Total = Working + Throttled
// + Paused + Idle. Each instant counts once: paused (from a "run_paused"
// event to the run's next event of another "run_..." kind), else
// throttled (any worker's throttle held), else idle (no worker of the run
// was alive: between calls of Run, a dead run after a crash, a cancelled
// run until it is resumed), else working. A run with no registered worker
// has no idle time. The report splits a run's time alike
// ([TimeSplit], [ReportTime]).
type StatusTime struct {
	TotalSeconds     float64 `json:"total_seconds"`
	WorkingSeconds   float64 `json:"working_seconds"`
	ThrottledSeconds float64 `json:"throttled_seconds"`
	PausedSeconds    float64 `json:"paused_seconds"`
	IdleSeconds      float64 `json:"idle_seconds"`
	// ThrottledFraction is ThrottledSeconds / TotalSeconds (0 for an
	// empty run).
	ThrottledFraction float64 `json:"throttled_fraction"`
}

// ChunkInFlight is a chunk being worked (the chunks_in_flight view).
type ChunkInFlight struct {
	Seq     int    `json:"seq"`
	ChunkID string `json:"chunk_id"`
	// WorkerKey, WorkerID, Host and PID name the worker ([Worker]); empty
	// when the chunk's transaction belongs to no registered worker.
	WorkerKey string `json:"worker_key"`
	WorkerID  string `json:"worker_id"`
	Host      string `json:"host"`
	PID       int    `json:"pid"`
	// Since is when the worker leased the chunk (or its transaction
	// began); AgeSeconds how long ago, by the server's clock.
	Since      *time.Time `json:"since,omitempty"`
	AgeSeconds float64    `json:"age_seconds"`
	// Stale reports a worker past its stale bound, about to be fenced.
	Stale bool `json:"stale"`
}

// ExceptionCount is the number of rows of a run's exception queue with
// one reason and column.
type ExceptionCount struct {
	Reason string `json:"reason"`
	Column string `json:"column"`
	Count  int64  `json:"count"`
}

// ETA returns ETASeconds as a duration; ok is false when it is unknown.
func (s Status) ETA() (eta time.Duration, ok bool) {
	if s.ETASeconds == nil {
		return 0, false
	}
	return time.Duration(*s.ETASeconds * float64(time.Second)), true
}

// String formats s for people, on a few lines, e.g.
//
//	job flights batch 3: running (running, 2 live workers)
//	chunks 45/100 done, 0 open, 53 pending, 0 failed, 2 in flight
//	rows read 1200000: inserted 1100000, updated 0, unchanged 90000, rejected 10000, deduplicated 0
//	rate 5210 rows/s recent, 4800 overall (per working second), 3300 wall
//	ETA 12m0s at 5210 rows/s (the recent working rate); of 20m0s so far 30% throttled, 0% paused, 1% idle
//
// then a line per throttle warning, the chunks in flight and the
// exceptions by reason. Each text from the manifest shows at most its
// first 1,000 characters, then its full length.
func (s Status) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s batch %d: %s (%s, %d live workers)\n", shown(s.Job), s.BatchID, s.Status, s.Liveness, s.LiveWorkers)
	c := s.Chunks
	fmt.Fprintf(&b, "chunks %d/%d done, %d open, %d pending, %d failed, %d in flight", c.Done, c.Total, c.Open, c.Pending, c.Failed, c.InFlight)
	if c.Skipped > 0 {
		fmt.Fprintf(&b, ", %d skipped unchanged", c.Skipped)
	}
	if c.Staged > 0 {
		fmt.Fprintf(&b, ", %d staged", c.Staged)
	}
	if c.RolledBack > 0 {
		fmt.Fprintf(&b, ", %d rolled back", c.RolledBack)
	}
	if c.Other > 0 {
		fmt.Fprintf(&b, ", %d other", c.Other)
	}
	r := s.Rows
	fmt.Fprintf(&b, "\nrows read %d: inserted %d, updated %d, unchanged %d, rejected %d, deduplicated %d\n",
		r.Read, r.Inserted, r.Updated, r.Unchanged, r.Rejected, r.Deduplicated)
	rate := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f", *p)
	}
	switch s.Status {
	case RunRunning, RunPaused:
		fmt.Fprintf(&b, "rate %s rows/s recent, %s overall (per working second), %s wall\n", rate(s.RecentRate), rate(s.OverallRate), rate(s.WallRate))
	case RunRolledBack:
		// Its counts are withdrawn; its rates are those of its load.
		fmt.Fprintf(&b, "rate of its load, before the rollback: %s rows/s overall (per working second), %s wall\n", rate(s.OverallRate), rate(s.WallRate))
	default:
		// An ended run has no recent rate to speak of.
		fmt.Fprintf(&b, "rate %s rows/s overall (per working second), %s wall\n", rate(s.OverallRate), rate(s.WallRate))
	}
	t := s.Time
	pct := func(x float64) float64 {
		if t.TotalSeconds <= 0 {
			return 0
		}
		return 100 * x / t.TotalSeconds
	}
	eta := "ETA unknown"
	switch d, ok := s.ETA(); {
	case s.Waiting != "":
		// The end of what a run waits for says how to end the wait.
		eta = "no ETA: " + oneLine(textcap.ClipMiddle(s.Waiting, statusTextCap, 400, "the whole text is in the Status's fields, or backfill status --json"))
	case ok && s.ETARate != nil:
		eta = fmt.Sprintf("ETA %s at %.0f rows/s (%s)", d.Round(time.Second), *s.ETARate, shown(s.ETABasis))
	case ok:
		eta = fmt.Sprintf("ETA %s", d.Round(time.Second))
	}
	fmt.Fprintf(&b, "%s; of %s so far %.0f%% throttled, %.0f%% paused, %.0f%% idle",
		eta, (time.Duration(t.TotalSeconds * float64(time.Second))).Round(time.Second), pct(t.ThrottledSeconds), pct(t.PausedSeconds), pct(t.IdleSeconds))
	for _, w := range s.ThrottleWarnings {
		fmt.Fprintf(&b, "\nwarning: throttle signal %s guards nothing since %s: %s", shown(w.Signal), w.Since.UTC().Format("2006-01-02 15:04:05Z"), shown(w.Why))
	}
	if s.Forecast != nil {
		fmt.Fprintf(&b, "\nforecast: %s", s.Forecast)
	}
	for _, w := range s.LockWaits {
		fmt.Fprintf(&b, "\nwaiting for a lock (%s) %s: worker %s on %s pid %d (backend %d)", shown(w.WaitEvent),
			time.Duration(w.Seconds*float64(time.Second)).Round(time.Second), shown(w.WorkerID), shown(w.Host), w.PID, w.BackendPID)
		if w.BlockerPID != 0 {
			fmt.Fprintf(&b, ", blocked by backend %d (%s, user %s, %s): %s", w.BlockerPID, shown(w.BlockerApp), shown(w.BlockerUser), shown(w.BlockerState),
				oneLine(w.BlockerQuery))
		}
	}
	if n := len(s.InFlight); n > 0 {
		b.WriteString("\nin flight:")
		for _, f := range s.InFlight {
			fmt.Fprintf(&b, "\n  %s (seq %d) worker %s on %s pid %d, %s", shown(f.ChunkID), f.Seq, shown(f.WorkerID), shown(f.Host), f.PID,
				time.Duration(f.AgeSeconds*float64(time.Second)).Round(time.Second))
			if f.Stale {
				b.WriteString(" (stale)")
			}
		}
	}
	if len(s.Exceptions) > 0 {
		b.WriteString("\nexceptions:")
		for _, e := range s.Exceptions {
			col := ""
			if e.Column != "" {
				col = " [" + shown(e.Column) + "]"
			}
			fmt.Fprintf(&b, "\n  %d %s%s", e.Count, shown(e.Reason), col)
		}
	}
	if a := s.Approval; a != nil && a.Policy != nil {
		fmt.Fprintf(&b, "\napprovals %d of %d of plan fingerprint %s (author %s, role %s):", len(a.Approvals), a.Policy.Approvers, a.Fingerprint, shown(a.Author), shown(a.AuthorRole))
		for _, ap := range a.Approvals {
			fmt.Fprintf(&b, "\n  %s by %s (role %s): %s", ap.CreatedAt.UTC().Format("2006-01-02 15:04:05Z"), shown(ap.Approver), shown(ap.DBRole), shown(ap.Reason))
		}
	}
	return b.String()
}

// statusTextCap is the most characters of one text (a job name, the
// reason of a pause, an exception's reason) [Status.String] shows.
const statusTextCap = 1000

// shown is s on one line (oneLine), cut to statusTextCap characters and
// then followed by its full length when longer.
func shown(s string) string {
	return oneLine(textcap.Clip(s, statusTextCap, "the whole text is in the Status's fields, or backfill status --json"))
}

// oneLine shows the control characters of s (newlines, terminal escapes)
// as \xNN or \uNNNN: text from the data stays on its line and cannot
// drive a terminal.
func oneLine(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case !unicode.IsControl(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// ThrottlePeriod is one hold of a backfillthrottle.Throttle by one worker
// (a call of backfill.Runner.Run), as recorded in the manifest.
type ThrottlePeriod struct {
	ID        int64  `db:"id"`
	BatchID   int64  `db:"batch_id"`
	WorkerKey string `db:"worker_key"`
	// Signal is the throttle's backfillthrottle.Signal.Name.
	Signal string `db:"signal"`
	// Reason says why it held (the value and the high watermark).
	Reason string `db:"reason"`
	// Value is the reading that started the hold; High and Low are the
	// watermarks in force.
	Value float64 `db:"value"`
	High  float64 `db:"high"`
	Low   float64 `db:"low"`
	// StartedAt and EndedAt are the server's times. EndedAt is nil while
	// the hold lasts; a hold whose worker died without ending it ends, as
	// read by backfilldriver.ManifestThrottle.ThrottlePeriods, at the
	// worker's last heartbeat (Ended reports the end used).
	StartedAt time.Time  `db:"started_at"`
	EndedAt   *time.Time `db:"ended_at"`
	// Ended is EndedAt, or the end assumed for a hold still open: the
	// worker's last heartbeat when it is gone, now when it lives.
	Ended time.Time `db:"ended"`
}

// Worker is one call of backfill.Runner.Run working a run, as the manifest's
// workers table records it.
type Worker struct {
	// Key is the call's random key; a chunk's transaction carries it in
	// application_name ("backfill <key> " before the session's own).
	Key string `db:"worker_key" json:"key"`
	// ID is backfill.Config.WorkerID.
	ID string `db:"worker_id" json:"id"`
	// BatchID and Job are the run worked.
	BatchID int64  `db:"batch_id" json:"batch_id"`
	Job     string `db:"job_name" json:"job"`
	// Host and PID are the worker's host name and operating system
	// process ID.
	Host string `db:"host" json:"host"`
	PID  int    `db:"pid" json:"pid"`
	// StaleAfter is the worker's backfill.Config.StaleAfter.
	StaleAfter time.Duration `db:"-" json:"stale_after"`
	// StartedAt, HeartbeatAt and FinishedAt (nil while working) are the
	// server's times.
	StartedAt   time.Time  `db:"started_at" json:"started_at"`
	HeartbeatAt time.Time  `db:"heartbeat_at" json:"heartbeat_at"`
	FinishedAt  *time.Time `db:"finished_at" json:"finished_at,omitempty"`
	// State is "working", "finished" (its Run call returned), or "lost":
	// it stopped heartbeating (crashed, killed, frozen) and its run has
	// since ended; FinishedAt is then when the run ended.
	State string `db:"state" json:"state"`
	// HeartbeatAge is how long ago, by the server's clock, the worker
	// last heartbeated, when the manifest was read.
	HeartbeatAge time.Duration `db:"-" json:"heartbeat_age"`
	// Stale reports whether the worker stopped heartbeating: unfinished
	// with a heartbeat older than its StaleAfter, or lost.
	Stale bool `db:"stale" json:"stale"`
}

// RunLiveness is a run's liveness
// (backfilldriver.ManifestWorkers.RunLiveness).
type RunLiveness struct {
	// BatchID, Job and Status are the run's.
	BatchID int64     `db:"batch_id" json:"batch_id"`
	Job     string    `db:"job_name" json:"job"`
	Status  RunStatus `db:"status" json:"status"`
	// Liveness is backfill.LivenessRunning, backfill.LivenessStalled or
	// backfill.LivenessDead for a running run, else the run's status.
	Liveness string `db:"liveness" json:"liveness"`
	// LastHeartbeat is the latest heartbeat of any worker of the run (nil
	// if none registered).
	LastHeartbeat *time.Time `db:"last_heartbeat" json:"last_heartbeat,omitempty"`
	// LiveWorkers counts the unfinished workers that heartbeated within
	// their StaleAfter.
	LiveWorkers int `db:"live_workers" json:"live_workers"`
}
