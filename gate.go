package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
)

// ManifestGates is implemented by manifests that keep the evidence of a
// failed quality gate outside the chunk attempt it rolled back;
// [PGManifest] and backfilltest.Manifest do. Without it the runner records
// only the failed attempt's check results, and not atomically with the
// pause.
type ManifestGates interface {
	// RecordGateFailure records, in one transaction of its own (db is not
	// the chunk's transaction, which has rolled back), the evidence of
	// attempt of chunk chunkID that a failed gate rolled back: every
	// check's result and the exceptions the attempt had found (write-time
	// and merge-time rejects), both marked with the attempt
	// ([Validation.FailedAttempt], [Exception.FailedAttempt]); it counts
	// the attempt in the chunk's Attempts (with the reason as its last
	// error) and pauses the run with reason. All of it commits or none: after a
	// crash before the commit the run is still running, the chunk pending,
	// and the next call judges the chunk again and records it then.
	RecordGateFailure(ctx context.Context, db sqlx.ExtContext, batchID int64, chunkID string, attempt int, results []CheckResult, exceptions []Exception, reason string) error
	// FailedAttemptExceptions returns the exceptions recorded by
	// RecordGateFailure, in (chunk Seq, attempt, row) order. They are not
	// part of [Manifest.Exceptions], the queue of rows not loaded by
	// checkpointed chunks.
	FailedAttemptExceptions(ctx context.Context, db sqlx.ExtContext, batchID int64) ([]Exception, error)
}

// Audit event kinds of quality gates and validators.
const (
	// EventGateAccepted: an operator accepted the failed gate of one
	// chunk ([Runner.AcceptGate]); Detail holds "chunk", "checks" and
	// "why".
	EventGateAccepted = "gate_accepted"
	// EventValidatorsSet: the job's validators when a run first ran;
	// Detail holds "validators".
	EventValidatorsSet = "validators_set"
	// EventValidatorsChanged: a call ran the run with other validators
	// than the previous call; Detail holds "before", "after", "added"
	// and "removed".
	EventValidatorsChanged = "validators_changed"
)

// AcceptGate accepts, for one chunk of job's paused run, the checks of
// severity error that failed on its last attempt, records that in the
// audit log (an [EventGateAccepted] event with actor and why, appended,
// never changed), resumes the run like [Runner.Resume] and runs it.
//
// The chunk is read again; when the accepted checks fail again they no
// longer stop it: it commits, its failed results are recorded with
// [CheckResult.Accepted] set, beside the evidence of the attempt that
// failed. Any other failed check of severity error still stops it. Other
// chunks are judged as before.
//
// It returns [ErrNotPaused] when the latest run is not paused,
// [ErrInvalidConfig] when actor or why is empty or the chunk has no failed
// gate to accept, and [ErrUnsupported] when the manifest cannot keep
// validations and an audit log.
func (r *Runner) AcceptGate(ctx context.Context, job Job, chunkID, actor, why string) (Report, error) {
	mv, audit := r.caps.validations, r.caps.audit
	if mv == nil || audit == nil {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q: %w", job.Name, ErrUnsupported)
	}
	if actor == "" || why == "" {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q: %w: who and why are required", job.Name, ErrInvalidConfig)
	}
	run, err := r.pausedRun(ctx, job, "accept gate of job")
	if err != nil {
		return Report{}, err
	}
	vs, err := mv.Validations(ctx, r.db, run.BatchID)
	if err != nil {
		return Report{}, err
	}
	checks, last := failedGate(vs, chunkID)
	if len(checks) == 0 {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q batch %d: %w: chunk %q has no failed gate to accept", job.Name, run.BatchID, ErrInvalidConfig, chunkID)
	}
	detail, err := json.Marshal(map[string]any{"chunk": chunkID, "checks": checks, "attempt": last, "why": why})
	if err != nil {
		return Report{}, err
	}
	err = inTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if err := audit.RecordEvent(ctx, tx, Event{BatchID: run.BatchID, Job: job.Name, Kind: EventGateAccepted, Actor: actor, Detail: detail}); err != nil {
			return err
		}
		return mv.ResumeRun(ctx, tx, run.BatchID, actor, why)
	})
	if err != nil {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q batch %d chunk %s: %w", job.Name, run.BatchID, chunkID, err)
	}
	r.cfg.Logger.Warn("quality gate accepted by operator; run resumed", "job", job.Name, "batch_id", run.BatchID, "chunk", chunkID,
		"checks", checks, "actor", actor, "why", why)
	return r.Run(ctx, job)
}

// pausedRun returns job's latest run, which must be paused
// ([ErrNotPaused] otherwise); what prefixes errors ("resume job").
func (r *Runner) pausedRun(ctx context.Context, job Job, what string) (Run, error) {
	if err := r.cfg.Manifest.Init(ctx, r.db); err != nil {
		return Run{}, err
	}
	run, err := r.caps.audit.LatestRun(ctx, r.db, job.Name)
	if err != nil {
		return Run{}, fmt.Errorf("backfill: %s %q: %w", what, job.Name, err)
	}
	if run.Status != RunPaused {
		return Run{}, fmt.Errorf("backfill: %s %q: %w: batch %d is %s", what, job.Name, ErrNotPaused, run.BatchID, run.Status)
	}
	return run, nil
}

// failedGate returns the failed checks of severity error of chunkID's
// last attempt that a gate rolled back, and that attempt (0 for none).
func failedGate(vs []Validation, chunkID string) (checks []string, attempt int) {
	for _, v := range vs {
		if v.ChunkID == chunkID && v.FailedAttempt > attempt {
			attempt = v.FailedAttempt
		}
	}
	for _, v := range vs {
		if v.ChunkID == chunkID && v.FailedAttempt == attempt && attempt > 0 && !v.Passed && v.Severity == SeverityError && !slices.Contains(checks, v.Check) {
			checks = append(checks, v.Check)
		}
	}
	return checks, attempt
}

// acceptedGates returns, per chunk ID, the checks accepted by operators
// in the run's audit log.
func acceptedGates(events []Event) map[string][]string {
	out := map[string][]string{}
	for _, e := range events {
		if e.Kind != EventGateAccepted {
			continue
		}
		var d struct {
			Chunk  string   `json:"chunk"`
			Checks []string `json:"checks"`
		}
		if json.Unmarshal(e.Detail, &d) == nil {
			out[d.Chunk] = append(out[d.Chunk], d.Checks...)
		}
	}
	return out
}

// validatorNames describes each validator for the audit log: its type and,
// for values JSON can show (the built-in checks are structs), its fields.
// Functions show their type only.
func validatorNames(vs []Validator) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		name := fmt.Sprintf("%T", v)
		if s, ok := v.(fmt.Stringer); ok {
			name += " " + s.String()
		} else if rv := reflect.ValueOf(v); rv.IsValid() && rv.Kind() != reflect.Func {
			if b, err := json.Marshal(v); err == nil {
				name += " " + string(b)
			}
		}
		out[i] = name
	}
	return out
}

// recordValidators appends to the run's audit log the validators this
// call runs with: [EventValidatorsSet] the first time,
// [EventValidatorsChanged] when they differ from the last recorded set.
// Validators are not part of the plan: changing them does not refuse a
// resume, but every change is on record. It returns a warning for a
// change ("" otherwise) and the accepted gates found in the log.
func (r *Runner) recordValidators(ctx context.Context, job Job, batchID int64) (string, map[string][]string, error) {
	audit := r.caps.audit
	if audit == nil {
		return "", nil, nil
	}
	events, err := audit.Events(ctx, r.db, batchID)
	if err != nil {
		return "", nil, err
	}
	cur := validatorNames(job.Validators)
	var prev []string
	seen := false
	for _, e := range events {
		var d struct {
			Validators []string `json:"validators"`
			After      []string `json:"after"`
		}
		switch e.Kind {
		case EventValidatorsSet:
			if json.Unmarshal(e.Detail, &d) == nil {
				prev, seen = d.Validators, true
			}
		case EventValidatorsChanged:
			if json.Unmarshal(e.Detail, &d) == nil {
				prev, seen = d.After, true
			}
		}
	}
	accepted := acceptedGates(events)
	if seen && slices.Equal(prev, cur) || !seen && len(cur) == 0 {
		return "", accepted, nil
	}
	ev := Event{BatchID: batchID, Job: job.Name, Kind: EventValidatorsSet, Actor: r.cfg.WorkerID}
	detail := map[string]any{"validators": cur}
	warning := ""
	if seen {
		var added, removed []string
		for _, v := range cur {
			if !slices.Contains(prev, v) {
				added = append(added, v)
			}
		}
		for _, v := range prev {
			if !slices.Contains(cur, v) {
				removed = append(removed, v)
			}
		}
		ev.Kind = EventValidatorsChanged
		detail = map[string]any{"before": prev, "after": cur, "added": added, "removed": removed}
		warning = fmt.Sprintf("the validators changed since the run's last call (recorded in the audit log): added [%s], removed [%s]",
			strings.Join(added, "; "), strings.Join(removed, "; "))
	}
	if ev.Detail, err = json.Marshal(detail); err != nil {
		return "", nil, err
	}
	if err := audit.RecordEvent(ctx, r.db, ev); err != nil {
		return "", nil, err
	}
	return warning, accepted, nil
}

// summarizeValidations fills the report's validation summary: one verdict
// per chunk and check, the latest recorded, however many times the chunk
// was judged (a gate that rolled an attempt back, then a resume).
func summarizeValidations(rep *Report, vs []Validation) {
	type key struct{ chunk, check string }
	latest := map[key]int{}
	var order []key
	for i, v := range vs {
		k := key{v.ChunkID, v.Check}
		if _, ok := latest[k]; !ok {
			order = append(order, k)
		}
		latest[k] = i
	}
	for i, v := range vs {
		if latest[key{v.ChunkID, v.Check}] != i && !v.Passed {
			rep.SupersededChecks = append(rep.SupersededChecks, fmt.Sprintf("%s: %s: expected %s, got %s (attempt %d, rolled back)",
				v.ChunkID, v.Check, v.Expected, v.Actual, v.FailedAttempt))
		}
	}
	for _, k := range order {
		v := vs[latest[k]]
		if v.Passed {
			rep.ChecksPassed++
			continue
		}
		rep.ChecksFailed++
		msg := fmt.Sprintf("%s: %s: expected %s, got %s", v.ChunkID, v.Check, v.Expected, v.Actual)
		if v.Accepted {
			rep.ChecksAccepted++
			msg += " (accepted)"
		}
		rep.FailedChecks = append(rep.FailedChecks, msg)
	}
}
