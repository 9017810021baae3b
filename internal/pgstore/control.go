package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/sqlgen"
)

// Knob names of [Manifest.SetKnob] (and the SQL function set_knob).
const (
	// KnobConcurrency is the workers of each process (a whole number, at
	// least 1); a process runs at most its backfill.Config.Concurrency, so the
	// knob lowers it or raises it back up to that.
	KnobConcurrency = "concurrency"
	// KnobJobConcurrency replaces backfill.Config.JobConcurrency (a whole
	// number, at least 1) in the processes that run with a JobConcurrency;
	// others ignore it.
	KnobJobConcurrency = "job_concurrency"
	// KnobRowsPerSecond replaces backfill.Config.RowsPerSecond (0: no cap).
	KnobRowsPerSecond = "rows_per_second"
)

// KnobThrottleHigh and KnobThrottleLow name the knobs that replace the High
// and Low watermarks of the backfillthrottle.Throttle whose signal is named
// signal.
func KnobThrottleHigh(signal string) string { return "throttle." + signal + ".high" }

// KnobThrottleLow names the knob that replaces the Low watermark; see
// [KnobThrottleHigh].
func KnobThrottleLow(signal string) string { return "throttle." + signal + ".low" }

// ControlManifest is the control plane as the Runner uses it
// ([Manifest]).
type ControlManifest interface {
	// ReadControl runs control action "pause", "resume" or "cancel"
	// ([Manifest.ReadControl]).
	ReadControl(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, actor, why string) error
	// SetKnob sets a live knob ([Manifest.SetKnob]).
	SetKnob(ctx context.Context, db sqlx.ExtContext, p backfilltype.SetKnobParams) error
	// Control returns a run's control state ([Manifest.Control]).
	Control(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.ControlState, error)
	// LibraryControl pauses or cancels on the library's own account
	// ([Manifest.LibraryControl]).
	LibraryControl(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, why string) error
	// Schema returns the manifest's schema name, unquoted.
	Schema() string
	// RecordThrottles records a worker's configured throttle
	// watermarks ([Manifest.RecordThrottles]).
	RecordThrottles(ctx context.Context, db sqlx.ExtContext, workerKey string, ts []ThrottleWatermarks) error
}

// ThrottleWatermarks are the configured High and Low of a worker's
// throttle of signal Signal (backfillthrottle.Throttle, in the signal's
// unit).
type ThrottleWatermarks struct {
	Signal    string
	High, Low float64
}

// RecordThrottles records, in a short transaction of its own, the
// configured watermarks of the throttles of the registered worker
// workerKey (table throttle_config), which the SQL function set_knob
// checks a throttle watermark knob against: it refuses a knob that
// would leave the low watermark of a worker's throttle above its high one.
func (m *Manifest) RecordThrottles(ctx context.Context, db sqlx.ExtContext, workerKey string, ts []ThrottleWatermarks) error {
	ctx = m.purpose(ctx, "record throttle watermarks", 0)
	if len(ts) == 0 {
		return nil
	}
	signals, highs, lows := make([]string, len(ts)), make([]float64, len(ts)), make([]float64, len(ts))
	for i, t := range ts {
		signals[i], highs[i], lows[i] = ManifestText(t.Signal), t.High, t.Low
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		_, err := tx.ExecContext(ctx, m.SQL(`INSERT INTO {s}.throttle_config (worker_key, signal, high, low)
			SELECT $1::text, x.signal, x.high, x.low FROM unnest($2::text[], $3::float8[], $4::float8[]) AS x(signal, high, low)
			ON CONFLICT DO NOTHING`), workerKey, pq.Array(signals), pq.Array(highs), pq.Array(lows))
		return err
	})
	if err != nil {
		return fmt.Errorf("backfill: record the throttles' watermarks of worker %s: %w", workerKey, err)
	}
	return nil
}

var _ ControlManifest = (*Manifest)(nil)

// Pause pauses run batchID through the SQL function pause: no worker of any
// process claims another chunk; the chunks in flight finish and checkpoint,
// and each call of backfill.Runner.Run on the run returns an error wrapping
// [backfilltype.ErrRunPaused]. actor and why are required (else an error
// wrapping [backfilltype.ErrInvalidConfig]). A run that is not running or
// failed gives an error wrapping [backfilltype.ErrRunStatus]; an unknown
// batch [backfilltype.ErrRunNotFound].
func (m *Manifest) Pause(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.ReadControl(ctx, db, "pause", batchID, actor, why)
}

// Resume resumes a paused or cancelled run batchID through the SQL function
// resume: it is running again, and the next backfill.Runner.Run of its job
// (or the calls still waiting on it) work it. Errors as [Manifest.Pause]; a
// run that is neither paused nor cancelled gives
// [backfilltype.ErrNotPaused] (and [backfilltype.ErrRunStatus]).
func (m *Manifest) Resume(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.ReadControl(ctx, db, "resume", batchID, actor, why)
}

// Cancel cancels run batchID through the SQL function cancel: the workers
// of every process abort their chunks in flight (rolled back: their leases
// released, the chunks pending, nothing half-merged) and claim nothing
// more; the run ends [backfilltype.RunCancelled] and each call of
// backfill.Runner.Run on it returns an error wrapping
// [backfilltype.ErrRunCancelled]. Only an explicit resume
// (backfill.Runner.Resume, [Manifest.Resume], SQL resume) restarts it;
// backfill.Job.NewRun starts a new run instead. Errors as [Manifest.Pause].
func (m *Manifest) Cancel(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.ReadControl(ctx, db, "cancel", batchID, actor, why)
}

// ReadControl runs control action ("pause", "resume" or "cancel") on run
// batchID through the SQL function of that name, by actor for the reason
// why, in a short transaction of its own: [Manifest.Pause],
// [Manifest.Resume] and [Manifest.Cancel] are it, with their errors. An
// actor over [MaxActorChars] or a why over [MaxReasonChars] characters
// gives an error wrapping [backfilltype.ErrInvalidConfig] naming the cap
// and the length; a role that may not execute the function (not an
// operator: [Manifest.OperatorGrants]) an error wrapping
// [backfilltype.ErrPrivilege] naming the role, the function and the fix.
func (m *Manifest) ReadControl(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, actor, why string) error {
	ctx = m.purpose(ctx, "read the control state", batchID)
	actor, why = ManifestText(actor), ManifestText(why)
	if action != "pause" && action != "resume" && action != "cancel" {
		return fmt.Errorf("backfill: %s run %d: %w: unknown control action %q (pause, resume or cancel)", action, batchID, backfilltype.ErrInvalidConfig, action)
	}
	if err := controlCaps(action, actor, why); err != nil {
		return fmt.Errorf("backfill: %s run %d: %w", action, batchID, err)
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.controlPrivilege(ctx, tx, action+"(bigint, text, text)"); err != nil {
			return err
		}
		var status string
		return sqlx.GetContext(ctx, tx, &status, m.SQL(`SELECT {s}.`+action+`($1::bigint, $2::text, $3::text)`), batchID, actor, why)
	})
	if err != nil {
		return fmt.Errorf("backfill: %s run %d: %w", action, batchID, controlError(err, action == "resume"))
	}
	return nil
}

// LibraryControl pauses or cancels (action) run batchID on the library's
// own account, through the SQL function library_control that a loader may
// execute ([Manifest.Grants]): the audit trail records actor "backfill"
// and the session's role, whatever the process claims; why says what
// happened (the signal, the process). Errors as [Manifest.Pause].
func (m *Manifest) LibraryControl(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, why string) error {
	ctx = m.purpose(ctx, "record a control action ("+action+")", batchID)
	why = ManifestText(why)
	if err := controlCaps(action, "backfill", why); err != nil {
		return fmt.Errorf("backfill: %s run %d: %w", action, batchID, err)
	}
	err := InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.controlPrivilege(ctx, tx, "library_control(bigint, text, text)"); err != nil {
			return err
		}
		var status string
		return sqlx.GetContext(ctx, tx, &status, m.SQL(`SELECT {s}.library_control($1::bigint, $2::text, $3::text)`), batchID, action, why)
	})
	if err != nil {
		return fmt.Errorf("backfill: %s run %d: %w", action, batchID, controlError(err, false))
	}
	return nil
}

// The caps, in characters (Unicode code points), of the text arguments of
// the control functions (pause, resume, cancel, set_knob): checked by the
// functions themselves and, with the same message, by this package before
// the call; a longer text gives an error wrapping
// [backfilltype.ErrInvalidConfig] that names the argument, its length and
// the cap.
const (
	// MaxActorChars caps an actor (who decides).
	MaxActorChars = 200
	// MaxReasonChars caps a reason (why).
	MaxReasonChars = 2000
	// MaxJobNameChars caps a job name given to a control function; the
	// run of a longer name is named by its batch id.
	MaxJobNameChars = 1000
	// MaxKnobKeyChars caps a knob's name.
	MaxKnobKeyChars = 200
	// MaxKnobValueChars caps a knob's value.
	MaxKnobValueChars = 100
)

// CheckCap returns an error wrapping [backfilltype.ErrInvalidConfig] when
// s, the argument what of action, is longer than max characters; the
// error names action, what, the length and max, not s.
func CheckCap(action, what, s string, max int) error {
	if len(s) <= max { // bytes >= characters
		return nil
	}
	if n := utf8.RuneCountInString(s); n > max {
		return fmt.Errorf("%w: %s: the %s is %d characters long; at most %d are accepted (shorten it)", backfilltype.ErrInvalidConfig, action, what, n, max)
	}
	return nil
}

// controlCaps checks actor and why against their caps.
func controlCaps(action, actor, why string) error {
	if err := CheckCap(action, "actor", actor, MaxActorChars); err != nil {
		return err
	}
	return CheckCap(action, "reason", why, MaxReasonChars)
}

// controlPrivilege returns an error wrapping [backfilltype.ErrPrivilege]
// when the session's role lacks USAGE on the schema or EXECUTE on the
// function fn (name and argument types) of the manifest, naming the role,
// the privilege and how the manifest's owner grants it. A function the
// schema does not have (an older version) passes: the call says so.
func (m *Manifest) controlPrivilege(ctx context.Context, tx sqlx.ExtContext, fn string) error {
	var p struct {
		Role  string `db:"role"`
		Usage bool   `db:"usage"`
		Exec  bool   `db:"exec"`
	}
	obj := sqlgen.Ident(m.SchemaName) + "." + fn
	// The function by its name and argument types in the catalog:
	// to_regprocedure needs USAGE on the schema.
	if err := sqlx.GetContext(ctx, tx, &p, `SELECT current_user AS role,
		coalesce((SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1), true) AS usage,
		coalesce((SELECT has_function_privilege(p.oid, 'EXECUTE') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 AND p.proname || '(' || oidvectortypes(p.proargtypes) || ')' = $2), true) AS exec`, m.SchemaName, fn); err != nil {
		return err
	}
	if p.Usage && p.Exec {
		return nil
	}
	what := "EXECUTE on function " + obj
	if !p.Usage {
		what = "USAGE on schema " + sqlgen.Ident(m.SchemaName) + " (and EXECUTE on function " + obj + ")"
	}
	if strings.HasPrefix(fn, "library_control(") {
		return fmt.Errorf("%w: role %s lacks %s, a loader's privilege: run as the manifest's owner: backfill migrate --schema %s --grant %s",
			backfilltype.ErrPrivilege, sqlgen.Ident(p.Role), what, sqlgen.Ident(m.SchemaName), sqlgen.Ident(p.Role))
	}
	return fmt.Errorf("%w: role %s lacks %s: the control functions are an operator role's; run as the manifest's owner: backfill migrate --schema %s --grant-operator OPERATOR, then GRANT OPERATOR TO %s (or connect as a member of an operator role)",
		backfilltype.ErrPrivilege, sqlgen.Ident(p.Role), what, sqlgen.Ident(m.SchemaName), sqlgen.Ident(p.Role))
}

// SetKnob sets live knob key of run batchID to value (a number as text, or
// "default" to go back to each process's backfill.Config) through the SQL
// function set_knob; every worker of every process applies it within one
// backfill.Config.ThrottleInterval. Keys: [KnobConcurrency],
// [KnobJobConcurrency], [KnobRowsPerSecond], [KnobThrottleHigh] and
// [KnobThrottleLow]. An unknown key, a bad value or a missing actor or why
// gives an error wrapping [backfilltype.ErrInvalidConfig] that names the
// key and value; a completed, rolled back or abandoned run
// [backfilltype.ErrRunStatus].
func (m *Manifest) SetKnob(ctx context.Context, db sqlx.ExtContext, p backfilltype.SetKnobParams) error {
	ctx = m.purpose(ctx, "set a knob", p.BatchID)
	batchID, key, value := p.BatchID, p.Key, p.Value
	actor, why := ManifestText(p.Actor), ManifestText(p.Why)
	action := "set_knob"
	err := CheckCap(action, "knob name", key, MaxKnobKeyChars)
	if err == nil {
		action += " " + key
		err = CheckCap(action, "knob value", value, MaxKnobValueChars)
	}
	if err == nil {
		err = controlCaps(action, actor, why)
	}
	if err != nil {
		// The text is not repeated: it may be too long.
		return fmt.Errorf("backfill: set a knob of run %d: %w", batchID, err)
	}
	err = InShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		if err := m.controlPrivilege(ctx, tx, "set_knob(bigint, text, text, text, text)"); err != nil {
			return err
		}
		var v string
		return sqlx.GetContext(ctx, tx, &v, m.SQL(`SELECT {s}.set_knob($1::bigint, $2::text, $3::text, $4::text, $5::text)`),
			batchID, ManifestText(key), ManifestText(value), actor, why)
	})
	if err != nil {
		err = controlError(err, false)
		if errors.Is(err, backfilltype.ErrRunStatus) {
			// A finished run never runs again: its knobs would apply to nothing.
			err = fmt.Errorf("%w (knobs apply to a running, paused, cancelled or failed run, kept for when it resumes; to change how the job runs again, start a new run, Job.NewRun, with the settings in its Config)", err)
		}
		return fmt.Errorf("backfill: set knob %q of run %d to %q: %w", key, batchID, value, err)
	}
	return nil
}

// Control returns run batchID's control state: status, reason and knobs.
func (m *Manifest) Control(ctx context.Context, db sqlx.ExtContext, batchID int64) (backfilltype.ControlState, error) {
	ctx = m.purpose(ctx, "read the run's control state", batchID)
	var rows []struct {
		Status string `db:"status"`
		Reason string `db:"last_error"`
		Knobs  string `db:"knobs"`
	}
	err := ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil
		return sqlx.SelectContext(ctx, tx, &rows, m.SQL(`SELECT r.status, r.last_error,
			coalesce((SELECT json_object_agg(k.key, k.value) FROM {s}.knobs k WHERE k.batch_id = r.batch_id), '{}')::text AS knobs
			FROM {s}.runs r WHERE r.batch_id = $1`), batchID)
	})
	if err != nil {
		return backfilltype.ControlState{}, fmt.Errorf("backfill: control state of run %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return backfilltype.ControlState{}, fmt.Errorf("backfill: control state of run %d: %w", batchID, backfilltype.ErrRunNotFound)
	}
	st := backfilltype.ControlState{Status: backfilltype.RunStatus(rows[0].Status), Reason: rows[0].Reason, Knobs: map[string]float64{}}
	if err := json.Unmarshal([]byte(rows[0].Knobs), &st.Knobs); err != nil {
		return backfilltype.ControlState{}, fmt.Errorf("backfill: control state of run %d: knobs: %w", batchID, err)
	}
	return st, nil
}

// controlError maps the SQLSTATEs of the control functions to sentinels.
func controlError(err error, resume bool) error {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return err
	}
	// The functions' messages begin with "backfill: " (for a psql
	// session); after the sentinel's, once is enough.
	msg := strings.TrimPrefix(pe.Message, "backfill: ")
	switch pe.Code {
	case "22023":
		return fmt.Errorf("%w: %s", backfilltype.ErrInvalidConfig, msg)
	case "P0002":
		return fmt.Errorf("%w: %s", backfilltype.ErrRunNotFound, msg)
	case "42501":
		// insufficient_privilege that controlPrivilege did not foresee.
		return fmt.Errorf("%w: %s (the control functions are an operator role's: backfill migrate --grant-operator)", backfilltype.ErrPrivilege, msg)
	case "55000":
		if resume {
			return fmt.Errorf("%w: %w: %s", backfilltype.ErrNotPaused, backfilltype.ErrRunStatus, msg)
		}
		return fmt.Errorf("%w: %s", backfilltype.ErrRunStatus, msg)
	}
	return err
}

// KnobValue returns the value of knob key in knobs, or def when it is
// unset or NaN.
func KnobValue(knobs map[string]float64, key string, def float64) float64 {
	if v, ok := knobs[key]; ok && !math.IsNaN(v) {
		return v
	}
	return def
}

// controlPayload is the JSON payload of a control notification.
type controlPayload struct {
	BatchID int64  `json:"batch_id"`
	Action  string `json:"action"`
	Job     string `json:"job"`
	Key     string `json:"key,omitempty"`
}

// ParseControlPayload decodes a notification's payload.
func ParseControlPayload(s string) (controlPayload, bool) {
	var p controlPayload
	if err := json.Unmarshal([]byte(s), &p); err != nil || p.BatchID == 0 {
		return p, false
	}
	return p, true
}

// quoteLiteral is the schema's name as a SQL string literal.
func quoteLiteral(s string) string {
	return pq.QuoteLiteral(strings.ToValidUTF8(s, "\uFFFD"))
}
