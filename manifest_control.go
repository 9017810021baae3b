package backfill

import (
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
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
	KnobConcurrency = pgstore.KnobConcurrency
	// KnobJobConcurrency replaces [Config.JobConcurrency] (a whole number,
	// at least 1) in the processes that run with a JobConcurrency; others
	// ignore it.
	KnobJobConcurrency = pgstore.KnobJobConcurrency
	// KnobRowsPerSecond replaces [Config.RowsPerSecond] (0: no cap).
	KnobRowsPerSecond = pgstore.KnobRowsPerSecond
)

// ControlState is what the workers of a run read of its control: the
// run's status (with the reason of a pause or cancel) and its live knobs,
// by name ([KnobConcurrency], ...).
type ControlState = backfilltype.ControlState
