package backfilltype

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// EventBlueprint: the blueprint of a run (Detail: the [Blueprint] as JSON),
// recorded when a call first works the run and again whenever a call's
// blueprint differs from the latest recorded one (other validators,
// limits, a rehearsal's forecast). The operator CLI ("backfill plan")
// prints the latest one of a run.
const EventBlueprint = "blueprint"

// Blueprint is a run's plan as a document for reviewers: what it reads
// and writes, how it judges success, how it can be withdrawn, its limits,
// and what changed since the job's previous plan. Its JSON form and its
// text ([Blueprint.Text]) list the fields in a fixed order. The plan's
// fields (fingerprinted) are those of [Plan]; Validators, MaxRunRejectRate,
// Limits and Rehearsal are the job's and the Runner's settings, which a
// run may change between calls without a new fingerprint (each change is
// recorded).
type Blueprint struct {
	Job string `json:"job"`
	// BatchID and Status are the run's, for a blueprint recorded for a
	// run (0 and "" for a job not started).
	BatchID int64     `json:"batch_id,omitempty"`
	Status  RunStatus `json:"status,omitempty"`
	// Fingerprint is the plan's: what approvals bind to.
	Fingerprint string         `json:"fingerprint"`
	CodeVersion string         `json:"code_version"`
	Source      string         `json:"source"`
	Scope       BlueprintScope `json:"scope"`
	// Modules are the parts of the backfill, each with its jobs: a
	// graph's modules (backfill.Runner.GraphBlueprint), or for a job's
	// blueprint one module, the job.
	Modules []BlueprintModule `json:"modules"`
	Limits  BlueprintLimits   `json:"limits"`
	// Approval is the plan's approval policy (nil: none).
	Approval *PlanApproval `json:"approval,omitempty"`
	// Rehearsal is the forecast of a rehearsal of the plan, when one
	// exists (nil otherwise).
	Rehearsal *BlueprintRehearsal `json:"rehearsal,omitempty"`
	// Previous names the job's previous plan (nil: none); Changes lists
	// what differs from it ([BlueprintDiff]), empty when nothing does.
	Previous *BlueprintPrevious `json:"previous,omitempty"`
	Changes  []string           `json:"changes"`
}

// BlueprintScope is the scope and chunking of a plan.
type BlueprintScope struct {
	// Scope is the chunker's description of the scope.
	Scope string `json:"scope"`
	// Chunker is the chunker's Go type ("" when not known: a blueprint
	// read from a plan).
	Chunker string `json:"chunker,omitempty"`
	Chunks  int    `json:"chunks"`
	// FirstChunk and LastChunk are the IDs of the first and last chunks.
	FirstChunk string `json:"first_chunk"`
	LastChunk  string `json:"last_chunk"`
	// EstimatedRows is the rows the run is expected to read: a
	// rehearsal's forecast, else the rows per chunk of the job's previous
	// run times Chunks; nil when nothing tells.
	EstimatedRows *int64 `json:"estimated_rows,omitempty"`
	// EstimateBasis says where EstimatedRows comes from.
	EstimateBasis string `json:"estimate_basis,omitempty"`
	// Time is the plan's time declarations (nil: none).
	Time *PlanTime `json:"time,omitempty"`
}

// BlueprintModule is one module of a backfill: one or more jobs that are
// processed, validated and rolled back together.
type BlueprintModule struct {
	Name string `json:"name"`
	// DependsOn, Priority, Class and Enabled are a graph's module's
	// (Enabled nil: the blueprint of a job, whose one module is the job).
	DependsOn []string       `json:"depends_on,omitempty"`
	Priority  int            `json:"priority,omitempty"`
	Class     ModuleClass    `json:"class,omitempty"`
	Enabled   *bool          `json:"enabled,omitempty"`
	Jobs      []BlueprintJob `json:"jobs"`
}

// BlueprintJob is one job of a module: its target and identity, its
// success metrics and its fallback path.
type BlueprintJob struct {
	Name string `json:"name"`
	// Fingerprint is the job's plan's, in a graph's blueprint ("" in a
	// job's: the blueprint's Fingerprint is the job's).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Chunks is the number of chunks of the job's plan, in a graph's
	// blueprint (0 in a job's: the blueprint's Scope.Chunks).
	Chunks int `json:"chunks,omitempty"`
	// Target is the frozen target: table, business key, written columns,
	// identity mode and its policies.
	Target PlanTarget `json:"target"`
	// Validators are the job's checks with their thresholds (their Go
	// type and settings), in order: the success metrics.
	Validators []string `json:"validators"`
	// MaxRunRejectRate is the run's reject gate (a fraction; negative:
	// off).
	MaxRunRejectRate float64 `json:"max_run_reject_rate"`
	// Publish is the publish mode ("per chunk" for the default).
	Publish string `json:"publish"`
	// Rollback is the fallback path.
	Rollback BlueprintRollback `json:"rollback"`
}

// BlueprintRollback is how a run can be withdrawn and what that restores.
type BlueprintRollback struct {
	Mechanism RollbackMechanism `json:"mechanism"`
	Restores  string            `json:"restores"`
}

// BlueprintLimits are the throttles and limits of the Runner that made the
// blueprint (backfill.Config, with defaults applied). Durations are Go
// duration strings. MaxRejectsPerChunk -1 is no limit. They are the document's, not the plan's:
// they are outside its fingerprint, so changing one does not invalidate
// approvals (the blueprint recorded for the run shows the change).
type BlueprintLimits struct {
	Concurrency        int      `json:"concurrency"`
	JobConcurrency     int      `json:"job_concurrency"`
	RowsPerSecond      float64  `json:"rows_per_second"`
	MemoryBudget       int64    `json:"memory_budget"`
	MaxAttempts        int      `json:"max_attempts"`
	RetryBackoff       string   `json:"retry_backoff"`
	MaxRejectsPerChunk int      `json:"max_rejects_per_chunk"`
	MaxStagingRejects  int      `json:"max_staging_rejects"`
	MaxMergeRefusals   int      `json:"max_merge_refusals"`
	LockTimeout        string   `json:"lock_timeout"`
	StatementTimeout   string   `json:"statement_timeout"`
	HeartbeatInterval  string   `json:"heartbeat_interval"`
	StaleAfter         string   `json:"stale_after"`
	ThrottleInterval   string   `json:"throttle_interval"`
	Throttles          []string `json:"throttles"`
}

// BlueprintRehearsal is the forecast of a rehearsal of the plan.
type BlueprintRehearsal struct {
	// ID names the rehearsal.
	ID string `json:"id"`
	// Summary is the forecast in a line.
	Summary string `json:"summary"`
	// Rows is the rows the rehearsal forecasts the run reads (0: none).
	Rows int64 `json:"rows,omitempty"`
	// Forecast is the rehearsal's forecast as its JSON document.
	Forecast json.RawMessage `json:"forecast,omitempty"`
}

// BlueprintPrevious names the job's previous plan.
type BlueprintPrevious struct {
	BatchID     int64     `json:"batch_id"`
	Status      RunStatus `json:"status"`
	Fingerprint string    `json:"fingerprint"`
}

// PlanBlueprint returns the blueprint of plan: its fingerprinted fields.
// A blueprint read back from the manifest's plan (no chunks held) names
// its first and last chunks only when the plan lists their IDs.
func PlanBlueprint(p Plan) Blueprint {
	b := Blueprint{Job: p.Job, Fingerprint: p.Fingerprint, CodeVersion: p.CodeVersion, Source: p.Source,
		Scope: BlueprintScope{Scope: p.Scope, Chunks: p.Len(), Time: p.Time}, Approval: p.Approval, Changes: []string{}}
	switch {
	case len(p.Chunks) > 0:
		b.Scope.FirstChunk, b.Scope.LastChunk = p.Chunks[0].ID, p.Chunks[len(p.Chunks)-1].ID
	case len(p.ChunkIDs) > 0:
		b.Scope.FirstChunk, b.Scope.LastChunk = p.ChunkIDs[0], p.ChunkIDs[len(p.ChunkIDs)-1]
	}
	pub := p.Publish
	if pub == "" {
		pub = "per chunk"
	}
	if len(p.Modules) > 0 {
		// A graph's plan: its modules, their jobs by name and fingerprint.
		b.Modules = make([]BlueprintModule, len(p.Modules))
		for i, m := range p.Modules {
			en := m.Enabled
			bm := BlueprintModule{Name: m.Name, DependsOn: append([]string{}, m.DependsOn...), Priority: m.Priority, Class: m.Class, Enabled: &en}
			for _, j := range m.Jobs {
				bm.Jobs = append(bm.Jobs, BlueprintJob{Name: j.Name, Fingerprint: j.Fingerprint, Validators: []string{}})
			}
			b.Modules[i] = bm
		}
		return b
	}
	b.Modules = []BlueprintModule{{Name: p.Job, Jobs: []BlueprintJob{{Name: p.Job, Target: p.Target, Validators: []string{}, Publish: pub,
		Rollback: BlueprintRollback{Mechanism: p.Rollback, Restores: RollbackRestores(p.Rollback, p.Target)}}}}}
	return b
}

// RollbackRestores says what a rollback of a run of mechanism m on
// target t restores.
func RollbackRestores(m RollbackMechanism, t PlanTarget) string {
	switch m {
	case RollbackUndoLog:
		s := fmt.Sprintf("deletes the rows the run inserted into %s (found by %s) and restores the prior image of every row it updated (kept in the undo log)", t.Table, t.InsertedBy)
		if t.Mode == History {
			s += ", reopening the intervals it closed"
		}
		return s + "; rows a later batch changed are refused unless forced"
	case RollbackSwitchBack:
		return "points readers back to the versions the run's publish replaced, which are kept"
	case RollbackNone:
		return "nothing: the job accepted that its batches cannot be withdrawn"
	}
	return ""
}

// BlueprintField is one field of a blueprint as its text shows it.
type BlueprintField struct {
	// Name is the field's path ("scope.chunks", "job.items.validators").
	Name  string
	Value string
}

// Fields returns the blueprint's fields in their stable order: the
// lines of [Blueprint.Text] and what [BlueprintDiff] compares.
// Previous and Changes are not among them.
func (b Blueprint) Fields() []BlueprintField {
	var f []BlueprintField
	add := func(name string, v any) {
		var s string
		switch x := v.(type) {
		case []string:
			s = "[" + strings.Join(x, "; ") + "]"
		case string:
			s = x
		case float64:
			s = strconv.FormatFloat(x, 'g', -1, 64)
		default:
			s = fmt.Sprint(x)
		}
		f = append(f, BlueprintField{Name: name, Value: s})
	}
	add("job", b.Job)
	if b.BatchID != 0 {
		add("batch_id", b.BatchID)
		add("status", string(b.Status))
	}
	add("fingerprint", b.Fingerprint)
	add("code_version", b.CodeVersion)
	add("source", b.Source)
	add("scope", b.Scope.Scope)
	add("scope.chunker", b.Scope.Chunker)
	add("scope.chunks", b.Scope.Chunks)
	add("scope.first_chunk", b.Scope.FirstChunk)
	add("scope.last_chunk", b.Scope.LastChunk)
	est := "unknown"
	if b.Scope.EstimatedRows != nil {
		est = fmt.Sprintf("%d rows (%s)", *b.Scope.EstimatedRows, b.Scope.EstimateBasis)
	}
	add("scope.estimate", est)
	if t := b.Scope.Time; t != nil {
		add("time.chunk_column", t.ChunkColumn)
		add("time.zone", t.Zone)
		add("time.date_meaning", string(t.DateMeaning))
		add("time.event_time", t.EventTime)
		add("time.modified_at", t.ModifiedAt)
		add("time.ingested_at", t.IngestedAt)
	}
	names := make([]string, len(b.Modules))
	for i, m := range b.Modules {
		names[i] = m.Name
	}
	add("modules", names)
	for _, m := range b.Modules {
		if m.Enabled != nil {
			p := "module." + m.Name + "."
			add(p+"depends_on", append([]string{}, m.DependsOn...))
			add(p+"priority", m.Priority)
			add(p+"class", string(m.Class))
			add(p+"enabled", strconv.FormatBool(*m.Enabled))
			jobs := make([]string, len(m.Jobs))
			for i, j := range m.Jobs {
				jobs[i] = j.Name
			}
			add(p+"jobs", jobs)
		}
		for _, j := range m.Jobs {
			p := "module." + m.Name + ".job." + j.Name + "."
			if m.Name == j.Name && len(m.Jobs) == 1 && m.Enabled == nil {
				p = "job." + j.Name + "."
			}
			if j.Fingerprint != "" {
				add(p+"fingerprint", j.Fingerprint)
			}
			t := j.Target
			add(p+"target.table", t.Table)
			add(p+"target.key", t.Key)
			add(p+"target.columns", t.Columns)
			add(p+"target.mode", string(t.Mode))
			add(p+"target.duplicates", string(t.Duplicates))
			add(p+"target.conflict", string(t.Conflict))
			add(p+"target.version", t.Version)
			add(p+"target.valid_from", t.ValidFrom)
			add(p+"target.valid_to", t.ValidTo)
			add(p+"target.derive", t.Derive)
			add(p+"target.hash_column", t.HashColumn)
			add(p+"target.inserted_by", t.InsertedBy)
			add(p+"target.updated_by", t.UpdatedBy)
			add(p+"validators", j.Validators)
			add(p+"max_run_reject_rate", j.MaxRunRejectRate)
			add(p+"publish", j.Publish)
			add(p+"rollback.mechanism", string(j.Rollback.Mechanism))
			add(p+"rollback.restores", j.Rollback.Restores)
		}
	}
	l := b.Limits
	add("limits.concurrency", l.Concurrency)
	add("limits.job_concurrency", l.JobConcurrency)
	add("limits.rows_per_second", l.RowsPerSecond)
	add("limits.memory_budget", l.MemoryBudget)
	add("limits.max_attempts", l.MaxAttempts)
	add("limits.retry_backoff", l.RetryBackoff)
	add("limits.max_rejects_per_chunk", l.MaxRejectsPerChunk)
	add("limits.max_staging_rejects", l.MaxStagingRejects)
	add("limits.max_merge_refusals", l.MaxMergeRefusals)
	add("limits.lock_timeout", l.LockTimeout)
	add("limits.statement_timeout", l.StatementTimeout)
	add("limits.heartbeat_interval", l.HeartbeatInterval)
	add("limits.stale_after", l.StaleAfter)
	add("limits.throttle_interval", l.ThrottleInterval)
	add("limits.throttles", l.Throttles)
	approval := "none"
	if a := b.Approval; a != nil {
		approval = fmt.Sprintf("%d approvers, author may approve: %v", a.Approvers, a.AuthorMayApprove)
	}
	add("approval", approval)
	rehearsal := "none"
	if r := b.Rehearsal; r != nil {
		rehearsal = r.ID + ": " + r.Summary
	}
	add("rehearsal", rehearsal)
	return f
}

// Text returns the blueprint as text: one "name: value" line per field
// ([Blueprint.Fields]), empty values shown as "-", then the previous plan
// and the changes from it.
func (b Blueprint) Text() string {
	var sb strings.Builder
	what := "job"
	if len(b.Modules) > 0 && b.Modules[0].Enabled != nil {
		what = "graph"
	}
	sb.WriteString("Blueprint of " + what + " " + strconv.Quote(b.Job) + "\n")
	fields := b.Fields()
	// The values start in one column, after the longest name (at least
	// the 40th).
	width := 40
	for _, f := range fields {
		width = max(width, len(f.Name)+1)
	}
	for _, f := range fields {
		v := f.Value
		if v == "" || v == "[]" {
			v = "-"
		}
		fmt.Fprintf(&sb, "  %-*s %s\n", width, f.Name+":", v)
	}
	if p := b.Previous; p != nil {
		fmt.Fprintf(&sb, "Changes since the previous plan (batch %d, %s, fingerprint %s):\n", p.BatchID, p.Status, p.Fingerprint)
	} else {
		sb.WriteString("Changes: none (no previous plan of the " + what + ")\n")
		return sb.String()
	}
	if len(b.Changes) == 0 {
		sb.WriteString("  none\n")
	}
	for _, c := range b.Changes {
		sb.WriteString("  " + c + "\n")
	}
	return sb.String()
}

// BlueprintDiff lists, in the order of [Blueprint.Fields], the fields in
// which blueprint b differs from a, each as `field: "old" -> "new"`; a
// field only one of them has (a module or job added or removed) shows ""
// on the other side. The batch, status and fingerprint are not compared
// (a changed plan has another fingerprint by definition); the fields that
// make it are. A field whose value a is not known (a blueprint read back
// from a plan lacks the chunker, validators and limits) is compared too:
// read both from the same source.
func BlueprintDiff(a, b Blueprint) []string {
	skip := map[string]bool{"batch_id": true, "status": true, "fingerprint": true}
	af, bf := a.Fields(), b.Fields()
	old := make(map[string]string, len(af))
	for _, f := range af {
		old[f.Name] = f.Value
	}
	seen := map[string]bool{}
	d := []string{}
	for _, f := range bf {
		seen[f.Name] = true
		if skip[f.Name] {
			continue
		}
		if o := old[f.Name]; o != f.Value {
			d = append(d, fmt.Sprintf("%s: %q -> %q", f.Name, o, f.Value))
		}
	}
	for _, f := range af {
		if !seen[f.Name] && !skip[f.Name] {
			d = append(d, fmt.Sprintf("%s: %q -> %q", f.Name, f.Value, ""))
		}
	}
	return d
}
