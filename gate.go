package backfill

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/valuedump"
)

// acceptedCheck is one failed check result an operator accepted for a
// chunk: its check name and the fingerprint of its evidence (empty for
// acceptances recorded before evidence was: the check name alone).
type acceptedCheck struct {
	Check       string `json:"check"`
	Expected    string `json:"expected"`
	Actual      string `json:"actual"`
	Fingerprint string `json:"fingerprint"`
}

// evidenceFingerprint identifies the evidence of a check result: its
// check, severity, expected and actual values and sample (hex SHA-256
// prefix). Two judgments of a chunk that found the same thing have the
// same fingerprint; a different count or other offending keys do not.
func evidenceFingerprint(cr CheckResult) string {
	sample := cr.Sample
	if sample == nil {
		sample = []string{}
	}
	b, _ := json.Marshal([]any{cr.Check, string(cr.Severity), cr.Expected, cr.Actual, sample})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// acceptedResult reports whether a failed result cr is covered by one of
// the accepted checks of its chunk: the same check with the same
// evidence.
func acceptedResult(acc []acceptedCheck, cr CheckResult) bool {
	fp := evidenceFingerprint(cr)
	return slices.ContainsFunc(acc, func(a acceptedCheck) bool {
		return a.Check == cr.Check && (a.Fingerprint == "" || a.Fingerprint == fp)
	})
}

// AcceptGate accepts, for one chunk of job's paused run, the checks of
// severity error that failed on its last attempt, records that in the audit
// log (an [backfilltype.EventGateAccepted] event with actor and why,
// appended, never changed), resumes the run like [Runner.Resume] and runs
// it.
//
// The acceptance covers the evidence accepted, not the check's name: the
// failed results of the chunk's last failed attempt, each identified by
// its check, expected and actual values and sample (recorded in the
// event's "evidence"). The chunk is read again; when an accepted check
// fails again with the same evidence it no longer stops it: it commits,
// its failed results are recorded with [backfilltype.CheckResult.Accepted]
// set, beside the evidence of the attempt that failed. A different verdict
// (another count, other offending keys, as when an open chunk is read again
// with new rows) fails the gate again, and so does any other failed check
// of severity error. Other chunks are judged as before. Like Resume, it
// records the run's rows at this point ([backfilltype.EventGateBaseline]).
//
// Only a chunk whose latest judgment is a failed gate can be accepted: a
// chunk judged again since (completed with an acceptance, or passed) is
// refused, even while another chunk's gate pauses the run.
//
// It returns [ErrNotPaused] when the latest run is not paused, an error
// wrapping [ErrNoFailedGate] and [ErrInvalidConfig] when the chunk has no
// failed gate to accept (naming the chunks that have one),
// [ErrInvalidConfig] when actor or why is empty, and [ErrUnsupported]
// when the manifest cannot keep validations and an audit log.
func (r *Runner) AcceptGate(ctx context.Context, job Job, chunkID, actor, why string) (Report, error) {
	ctx = pgstore.WithPurpose(ctx, "accept a quality gate", 0)
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
	states, err := r.cfg.Manifest.Chunks(ctx, r.db, run.BatchID)
	if err != nil {
		return Report{}, err
	}
	g := failedGates(vs, states, chunkID)
	if !slices.Contains(g.chunks, chunkID) {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q batch %d: %w (%w): chunk %q has no failed gate to accept (never failed one, or judged again since); chunks with a failed gate: [%s]; the run is paused for: %s",
			job.Name, run.BatchID, ErrNoFailedGate, ErrInvalidConfig, chunkID, strings.Join(g.chunks, ", "), run.LastError)
	}
	checks, evidence, last := g.checks, g.evidence, g.attempt
	if len(checks) == 0 {
		return Report{}, fmt.Errorf("backfill: accept gate of job %q batch %d: %w (%w): chunk %q failed no check of severity error on attempt %d",
			job.Name, run.BatchID, ErrNoFailedGate, ErrInvalidConfig, chunkID, last)
	}
	detail, err := json.Marshal(map[string]any{"chunk": chunkID, "checks": checks, "attempt": last, "why": why, "evidence": evidence})
	if err != nil {
		return Report{}, err
	}
	baseline, err := r.baselineEvent(ctx, job.Name, run.BatchID, actor)
	if err != nil {
		return Report{}, err
	}
	err = pgstore.InBoundedTx(ctx, r.db, func(tx sqlx.ExtContext) error {
		if err := audit.RecordEvent(ctx, tx, backfilltype.Event{BatchID: run.BatchID, Job: job.Name, Kind: backfilltype.EventGateAccepted, Actor: actor, Detail: detail}); err != nil {
			return err
		}
		if err := audit.RecordEvent(ctx, tx, baseline); err != nil {
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

// gateToAccept is what failedGates found: the chunks whose latest
// judgment is a failed gate, and chunkID's failed checks of severity error
// on that attempt with their evidence.
type gateToAccept struct {
	chunks   []string
	attempt  int
	checks   []string
	evidence []acceptedCheck
}

// failedGates finds, in the validations vs of a run whose chunks are
// states, the chunks with a failed gate to accept (those whose latest
// judgment is an attempt a gate rolled back, and that are not done) and,
// when chunkID is one, what its gate failed.
func failedGates(vs []backfilltype.Validation, states []backfilltype.ChunkState, chunkID string) gateToAccept {
	var g gateToAccept
	latest := map[string]int{} // chunk ID -> index of its latest result
	for i, v := range vs {
		latest[v.ChunkID] = i
	}
	for _, st := range states {
		if i, ok := latest[st.Chunk.ID]; ok && vs[i].FailedAttempt > 0 && st.Status != ChunkDone {
			g.chunks = append(g.chunks, st.Chunk.ID)
		}
	}
	if !slices.Contains(g.chunks, chunkID) {
		return g
	}
	g.attempt = vs[latest[chunkID]].FailedAttempt
	for _, v := range vs {
		if v.ChunkID == chunkID && v.FailedAttempt == g.attempt && !v.Passed && v.Severity == SeverityError {
			if !slices.Contains(g.checks, v.Check) {
				g.checks = append(g.checks, v.Check)
			}
			g.evidence = append(g.evidence, acceptedCheck{Check: v.Check, Expected: v.Expected, Actual: v.Actual, Fingerprint: evidenceFingerprint(v.CheckResult)})
		}
	}
	return g
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
	if run.Status != RunPaused && (run.Status != RunCancelled || what != "resume job") {
		return Run{}, fmt.Errorf("backfill: %s %q: %w: batch %d is %s", what, job.Name, ErrNotPaused, run.BatchID, run.Status)
	}
	return run, nil
}

// baselineEvent returns the [backfilltype.EventGateBaseline] event of a
// resume of batchID by actor: the run's read and rejected rows now, over
// its done and open chunks. The run is paused: no chunk is in flight.
func (r *Runner) baselineEvent(ctx context.Context, job string, batchID int64, actor string) (backfilltype.Event, error) {
	total, err := loadedTotals(ctx, r.cfg.Manifest, r.db, batchID)
	if err != nil {
		return backfilltype.Event{}, err
	}
	detail, err := json.Marshal(map[string]int64{"read": total.Read, "rejected": total.Rejected})
	if err != nil {
		return backfilltype.Event{}, err
	}
	return backfilltype.Event{BatchID: batchID, Job: job, Kind: backfilltype.EventGateBaseline, Actor: actor, Detail: detail}, nil
}

// acceptedGates returns, per chunk ID, the check results accepted by
// operators in the run's audit log, and the latest resume baseline: the
// counts of the latest [backfilltype.EventGateBaseline] or operator's
// resume ("run_resumed_by_operator", whose detail holds "read" and
// "rejected").
func acceptedGates(events []backfilltype.Event) (map[string][]acceptedCheck, Counts) {
	out := map[string][]acceptedCheck{}
	var baseline Counts
	for _, e := range events {
		switch e.Kind {
		case backfilltype.EventGateAccepted:
			var d struct {
				Chunk    string          `json:"chunk"`
				Checks   []string        `json:"checks"`
				Evidence []acceptedCheck `json:"evidence"`
			}
			if json.Unmarshal(e.Detail, &d) != nil {
				continue
			}
			if d.Evidence != nil {
				out[d.Chunk] = append(out[d.Chunk], d.Evidence...)
				continue
			}
			// Recorded before acceptances kept their evidence: the
			// check's name alone.
			for _, c := range d.Checks {
				out[d.Chunk] = append(out[d.Chunk], acceptedCheck{Check: c})
			}
		case backfilltype.EventGateBaseline, "run_resumed_by_operator":
			// A resume from SQL or the CLI records the run's rows in its
			// own event (manifest version 24 on); a resume recorded
			// without them leaves the baseline as it was.
			var d struct {
				Read     *int64 `json:"read"`
				Rejected *int64 `json:"rejected"`
			}
			if json.Unmarshal(e.Detail, &d) == nil && d.Read != nil && d.Rejected != nil {
				baseline = Counts{Read: *d.Read, Rejected: *d.Rejected}
			}
		}
	}
	return out, baseline
}

// validatorNames describes each validator for the audit log, so that a
// change of validator changes the description where Go lets it be seen:
// its type; for a [fmt.Stringer] its String(); for a function (such as
// a [ValidatorFunc]) the symbol name of the function
// (runtime.FuncForPC), so swapping one function literal for another is
// seen; for other values their JSON (exported fields), followed, when
// the value holds what JSON cannot show (unexported fields, functions),
// by a dump of every field (functions by symbol name, pointers followed,
// no addresses). Limits: two closures of the same function literal that
// capture different values look the same, and so do values differing
// only behind a channel, an unsafe pointer or past 4 levels of nesting.
func validatorNames(vs []Validator) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		name := fmt.Sprintf("%T", v)
		rv := reflect.ValueOf(v)
		switch {
		case !rv.IsValid():
		case rv.Kind() == reflect.Func:
			name += " " + valuedump.FuncName(rv)
		default:
			if s, ok := v.(fmt.Stringer); ok {
				name += " " + s.String()
				break
			}
			if b, err := json.Marshal(v); err == nil {
				name += " " + string(b)
			}
			if valuedump.HiddenConfig(rv.Type(), map[reflect.Type]bool{}) {
				var b strings.Builder
				valuedump.Dump(&b, rv, 0)
				d := b.String()
				if len(d) > 1000 {
					sum := sha256.Sum256([]byte(d))
					d = pgstore.ValidPrefix(d, 500) + "…#" + hex.EncodeToString(sum[:8])
				}
				name += " " + d
			}
		}
		out[i] = name
	}
	return out
}

// recordValidators appends to the run's audit log the validators this call
// runs with: [backfilltype.EventValidatorsSet] the first time,
// [backfilltype.EventValidatorsChanged] when they differ from the last
// recorded set. Validators are not part of the plan: changing them does not
// refuse a resume, but every change is on record. It returns a warning for
// a change ("" otherwise), the accepted gates found in the log and the
// latest resume baseline ([backfilltype.EventGateBaseline]).
func (r *Runner) recordValidators(ctx context.Context, job Job, batchID int64) (string, map[string][]acceptedCheck, Counts, error) {
	audit := r.caps.audit
	if audit == nil {
		return "", nil, Counts{}, nil
	}
	events, err := audit.Events(ctx, r.db, batchID)
	if err != nil {
		return "", nil, Counts{}, err
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
		case backfilltype.EventValidatorsSet:
			if json.Unmarshal(e.Detail, &d) == nil {
				prev, seen = d.Validators, true
			}
		case backfilltype.EventValidatorsChanged:
			if json.Unmarshal(e.Detail, &d) == nil {
				prev, seen = d.After, true
			}
		}
	}
	accepted, baseline := acceptedGates(events)
	if seen && slices.Equal(prev, cur) || !seen && len(cur) == 0 {
		return "", accepted, baseline, nil
	}
	ev := backfilltype.Event{BatchID: batchID, Job: job.Name, Kind: backfilltype.EventValidatorsSet, Actor: r.cfg.WorkerID}
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
		ev.Kind = backfilltype.EventValidatorsChanged
		detail = map[string]any{"before": prev, "after": cur, "added": added, "removed": removed}
		warning = fmt.Sprintf("the validators changed since the run's last call (recorded in the audit log): added [%s], removed [%s]",
			strings.Join(added, "; "), strings.Join(removed, "; "))
	}
	if ev.Detail, err = json.Marshal(detail); err != nil {
		return "", nil, Counts{}, err
	}
	if err := audit.RecordEvent(ctx, r.db, ev); err != nil {
		return "", nil, Counts{}, err
	}
	return warning, accepted, baseline, nil
}

// summarizeValidations fills the report's validation summary: one verdict
// per chunk and check, the latest recorded, however many times the chunk
// was judged (a gate that rolled an attempt back, then a resume).
func summarizeValidations(rep *Report, vs []backfilltype.Validation) {
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
