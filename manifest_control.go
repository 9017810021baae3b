package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Control from SQL. The manifest's schema holds the functions an operator
// (psql, a CLI, a Go program) calls to steer a run; the Go API
// ([PGManifest.Pause], [PGManifest.Resume], [PGManifest.Cancel],
// [PGManifest.SetKnob], and the [Runner] wrappers) calls the same
// functions, so there is one implementation:
//
//	SELECT backfill.pause(42, 'alice', 'replica lag during the sale');
//	SELECT backfill.resume('flights', 'alice', 'lag is back to normal');
//	SELECT backfill.cancel(42, 'alice', 'wrong scope');
//	SELECT backfill.set_knob(42, 'rows_per_second', '5000', 'alice', 'night');
//
// Each takes the run as its batch id (bigint) or as a job name (text: the
// job's latest run that is running, failed, paused or cancelled), an
// actor and a reason (both required), refuses a transition the run's
// status does not allow (SQLSTATE 55000), appends an event to the audit
// log (events, which a trigger keeps append-only) in the same
// transaction, and sends a notification on the channel named after the
// schema with a JSON payload {"batch_id": 42, "action": "pause", "job":
// "flights"} (plus "key" for set_knob), delivered at commit. They return
// the run's new status (the knob's stored value for set_knob).
//
// Transitions: pause takes a running or failed run to paused; resume a
// paused or cancelled run to running; cancel a running, paused or failed
// run to cancelled ([RunCancelled], terminal until resumed). Knobs
// ([ControlState.Knobs]) are stored per run in the knobs table, which
// every worker of every process reads (see [Config.ListenURL]). The
// functions are created by manifest migration 16
// (migration/016_control.up.sql).

// Knob names of [PGManifest.SetKnob] (and the SQL function set_knob).
const (
	// KnobConcurrency is the workers of each process (a whole number, at
	// least 1); a process runs at most its [Config.Concurrency], so the
	// knob lowers it or raises it back up to that.
	KnobConcurrency = "concurrency"
	// KnobJobConcurrency replaces [Config.JobConcurrency] (a whole number,
	// at least 1) in the processes that run with a JobConcurrency; others
	// ignore it.
	KnobJobConcurrency = "job_concurrency"
	// KnobRowsPerSecond replaces [Config.RowsPerSecond] (0: no cap).
	KnobRowsPerSecond = "rows_per_second"
)

// KnobThrottleHigh and KnobThrottleLow name the knobs that replace the
// High and Low watermarks of the [Throttle] whose signal is named signal.
func KnobThrottleHigh(signal string) string { return "throttle." + signal + ".high" }

// KnobThrottleLow: see [KnobThrottleHigh].
func KnobThrottleLow(signal string) string { return "throttle." + signal + ".low" }

// ControlState is what the workers of a run read of its control: the
// run's status (with the reason of a pause or cancel) and its live knobs,
// by name ([KnobConcurrency], ...).
type ControlState struct {
	Status RunStatus
	Reason string
	Knobs  map[string]float64
}

// controlManifest is the control plane as the Runner uses it
// ([PGManifest]).
type controlManifest interface {
	control(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, actor, why string) error
	SetKnob(ctx context.Context, db sqlx.ExtContext, batchID int64, key, value, actor, why string) error
	Control(ctx context.Context, db sqlx.ExtContext, batchID int64) (ControlState, error)
	Schema() string
}

var _ controlManifest = (*PGManifest)(nil)

// Pause pauses run batchID through the SQL function pause: no worker of
// any process claims another chunk; the chunks in flight finish and
// checkpoint, and each call of [Runner.Run] on the run returns an error
// wrapping [ErrRunPaused]. actor and why are required (else an error
// wrapping [ErrInvalidConfig]). A run that is not running or failed gives
// an error wrapping [ErrRunStatus]; an unknown batch [ErrRunNotFound].
func (m *PGManifest) Pause(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.control(ctx, db, "pause", batchID, actor, why)
}

// Resume resumes a paused or cancelled run batchID through the SQL
// function resume: it is running again, and the next [Runner.Run] of its
// job (or the calls still waiting on it) work it. Errors as
// [PGManifest.Pause]; a run that is neither paused nor cancelled gives
// [ErrNotPaused] (and [ErrRunStatus]).
func (m *PGManifest) Resume(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.control(ctx, db, "resume", batchID, actor, why)
}

// Cancel cancels run batchID through the SQL function cancel: the
// workers of every process abort their chunks in flight (rolled back:
// their leases released, the chunks pending, nothing half-merged) and
// claim nothing more; the run ends [RunCancelled] and each call of
// [Runner.Run] on it returns an error wrapping [ErrRunCancelled]. Only an
// explicit resume ([Runner.Resume], [PGManifest.Resume], SQL resume)
// restarts it; [Job.NewRun] starts a new run instead. Errors as
// [PGManifest.Pause].
func (m *PGManifest) Cancel(ctx context.Context, db sqlx.ExtContext, batchID int64, actor, why string) error {
	return m.control(ctx, db, "cancel", batchID, actor, why)
}

func (m *PGManifest) control(ctx context.Context, db sqlx.ExtContext, action string, batchID int64, actor, why string) error {
	actor, why = ManifestText(actor), ManifestText(why)
	err := inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		var status string
		return sqlx.GetContext(ctx, tx, &status, m.sql(`SELECT {s}.control($1::bigint, $2::text, $3::text, $4::text)`), batchID, action, actor, why)
	})
	if err != nil {
		return fmt.Errorf("backfill: %s run %d: %w", action, batchID, controlError(err, action == "resume"))
	}
	return nil
}

// SetKnob sets live knob key of run batchID to value (a number as text,
// or "default" to go back to each process's [Config]) through the SQL
// function set_knob; every worker of every process applies it within one
// [Config.ThrottleInterval]. Keys: [KnobConcurrency],
// [KnobJobConcurrency], [KnobRowsPerSecond], [KnobThrottleHigh] and
// [KnobThrottleLow]. An unknown key, a bad value or a missing actor or
// why gives an error wrapping [ErrInvalidConfig] that names the key and
// value; a completed, rolled back or abandoned run [ErrRunStatus].
func (m *PGManifest) SetKnob(ctx context.Context, db sqlx.ExtContext, batchID int64, key, value, actor, why string) error {
	actor, why = ManifestText(actor), ManifestText(why)
	err := inShortTx(ctx, db, func(tx sqlx.ExtContext) error {
		var v string
		return sqlx.GetContext(ctx, tx, &v, m.sql(`SELECT {s}.set_knob($1::bigint, $2::text, $3::text, $4::text, $5::text)`),
			batchID, ManifestText(key), ManifestText(value), actor, why)
	})
	if err != nil {
		return fmt.Errorf("backfill: set knob %q of run %d to %q: %w", key, batchID, value, controlError(err, false))
	}
	return nil
}

// Control returns run batchID's control state: status, reason and knobs.
func (m *PGManifest) Control(ctx context.Context, db sqlx.ExtContext, batchID int64) (ControlState, error) {
	var rows []struct {
		Status string `db:"status"`
		Reason string `db:"last_error"`
		Knobs  string `db:"knobs"`
	}
	err := readTx(ctx, db, func(tx sqlx.ExtContext) error {
		rows = nil
		return sqlx.SelectContext(ctx, tx, &rows, m.sql(`SELECT r.status, r.last_error,
			coalesce((SELECT json_object_agg(k.key, k.value) FROM {s}.knobs k WHERE k.batch_id = r.batch_id), '{}')::text AS knobs
			FROM {s}.runs r WHERE r.batch_id = $1`), batchID)
	})
	if err != nil {
		return ControlState{}, fmt.Errorf("backfill: control state of run %d: %w", batchID, err)
	}
	if len(rows) == 0 {
		return ControlState{}, fmt.Errorf("backfill: control state of run %d: %w", batchID, ErrRunNotFound)
	}
	st := ControlState{Status: RunStatus(rows[0].Status), Reason: rows[0].Reason, Knobs: map[string]float64{}}
	if err := json.Unmarshal([]byte(rows[0].Knobs), &st.Knobs); err != nil {
		return ControlState{}, fmt.Errorf("backfill: control state of run %d: knobs: %w", batchID, err)
	}
	return st, nil
}

// controlError maps the SQLSTATEs of the control functions to sentinels.
func controlError(err error, resume bool) error {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "22023":
		return fmt.Errorf("%w: %s", ErrInvalidConfig, pe.Message)
	case "P0002":
		return fmt.Errorf("%w: %s", ErrRunNotFound, pe.Message)
	case "55000":
		if resume {
			return fmt.Errorf("%w: %w: %s", ErrNotPaused, ErrRunStatus, pe.Message)
		}
		return fmt.Errorf("%w: %s", ErrRunStatus, pe.Message)
	}
	return err
}

// knobInt returns knob key of st as a whole number, or def when unset.
func knobValue(knobs map[string]float64, key string, def float64) float64 {
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

// parseControlPayload decodes a notification's payload.
func parseControlPayload(s string) (controlPayload, bool) {
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
