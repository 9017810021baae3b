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
	// resume's transaction.
	EventGateBaseline = "gate_baseline"
)
