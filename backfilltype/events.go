package backfilltype

// Event kinds of the view switch of backfill.PublishVersionedView, in the
// audit log (backfilldriver.ManifestAudit).
const (
	// EventPublished: the view was switched to the batch's version, in
	// the switch's transaction; detail: view, version, previous.
	EventPublished = "published"
	// EventPublishBlocked: every try of the switch timed out behind
	// sessions holding the view; the run is completed but unpublished
	// (runs.last_error says so, and backfill.completed_batches leaves it
	// out) until a later call of Run publishes it; detail: view, version,
	// tries, lock_timeout, blockers.
	EventPublishBlocked = "publish_blocked"
)

// Audit event kinds of quality gates and validators.
const (
	// EventGateAccepted: an operator accepted the failed gate of one
	// chunk (backfill.Runner.AcceptGate); Detail holds "chunk", "checks" and
	// "why".
	EventGateAccepted = "gate_accepted"
	// EventValidatorsSet: the job's validators when a run first ran;
	// Detail holds "validators".
	EventValidatorsSet = "validators_set"
	// EventValidatorsChanged: a call ran the run with other validators
	// than the previous call; Detail holds "before", "after", "added"
	// and "removed".
	EventValidatorsChanged = "validators_changed"
	// EventGateBaseline: an operator resumed a paused run
	// (backfill.Runner.Resume, backfill.Runner.AcceptGate); Detail holds
	// "read" and "rejected", the run's rows (of its done and open chunks)
	// at that point. The run reject gate (backfill.Job.MaxRunRejectRate)
	// and the "no row loaded" pause then judge only the rows read after it:
	// the rejects before were the operator's decision. Recorded in the
	// resume's transaction. A resume through the manifest's SQL function
	// resume (the CLI's "backfill resume") records the same counts in the
	// detail of its "run_resumed_by_operator" event instead.
	EventGateBaseline = "gate_baseline"
)

// Audit event kinds of throttle signals that cannot observe what they
// guard (backfillthrottle.Observer). Each is recorded by the first worker
// of the run that finds the signal's state changed (a run has at most one
// per change, but for workers that tell at the same moment); Detail holds
// "signal", "why" (empty for EventSignalObserves) and "worker" (the
// backfill.Config.WorkerID that found it).
const (
	// EventSignalInert: the signal guards nothing (a replica lag signal
	// on a server with no replica): it reads values that never hold its
	// throttle. [Status.ThrottleWarnings] lists it until an
	// EventSignalObserves of the signal follows.
	EventSignalInert = "throttle_signal_inert"
	// EventSignalObserves: a signal recorded inert observes again (a
	// replica attached).
	EventSignalObserves = "throttle_signal_observes"
)
