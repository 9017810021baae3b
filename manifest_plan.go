package backfill

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// NewPlan freezes a prepared job into a [Plan] with its fingerprint. info
// is the target as [Merger.Prepare] resolved it; chunks come from the
// job's Chunker.
func NewPlan(job Job, info TableInfo, chunks []Chunk) Plan {
	cols := make([]string, info.Written)
	for i, c := range info.Columns[:info.Written] {
		cols[i] = c.Name
	}
	var derive []string
	for _, r := range info.Target.Derive {
		derive = append(derive, r.String())
	}
	ids := make([]string, len(chunks))
	for i, c := range chunks {
		ids[i] = c.ID
	}
	p := Plan{
		Job:         job.Name,
		Source:      job.Source,
		CodeVersion: job.CodeVersion,
		Scope:       job.Chunker.Scope(),
		Target: PlanTarget{
			Table:      info.Target.Table,
			Key:        slices.Clone(info.Target.Key),
			Columns:    cols,
			Mode:       info.Target.Mode,
			Duplicates: info.Target.Duplicates,
			Conflict:   info.Target.Conflict,
			Version:    info.Target.Version,
			ValidFrom:  info.Target.ValidFrom,
			ValidTo:    info.Target.ValidTo,
			Derive:     derive,
			HashColumn: info.Target.HashColumn,
			InsertedBy: info.Target.Lineage.InsertedBy,
			UpdatedBy:  info.Target.Lineage.UpdatedBy,
		},
		Rollback: job.Rollback,
		Publish:  job.Publish.String(),
		ChunkIDs: ids,
		Chunks:   chunks,
	}
	pt := PlanTime{ChunkColumn: job.ChunkColumn, DateMeaning: job.DateMeaning,
		EventTime: info.Target.EventTime, ModifiedAt: info.Target.ModifiedAt, IngestedAt: info.Target.IngestedAt}
	if job.Zone != nil {
		pt.Zone = job.Zone.String()
	}
	if pt != (PlanTime{}) {
		p.Time = &pt
	}
	p.Fingerprint = p.fingerprint()
	return p
}

func (p Plan) fingerprint() string {
	b, err := json.Marshal(p)
	if err != nil { // only plain strings and slices: cannot happen
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// PlanDiff lists, in a stable order, the fields in which plan b differs
// from plan a, each as `field: "old" -> "new"`. It is what [ErrPlanChanged]
// messages show.
func PlanDiff(a, b Plan) []string {
	var d []string
	show := func(v any) string {
		if l, ok := v.([]string); ok {
			return "[" + strings.Join(l, ", ") + "]"
		}
		return fmt.Sprint(v)
	}
	add := func(field string, x, y any) {
		xs, ys := show(x), show(y)
		if xs != ys {
			d = append(d, fmt.Sprintf("%s: %q -> %q", field, xs, ys))
		}
	}
	add("source", a.Source, b.Source)
	add("code_version", a.CodeVersion, b.CodeVersion)
	add("scope", a.Scope, b.Scope)
	add("target.table", a.Target.Table, b.Target.Table)
	add("target.key", a.Target.Key, b.Target.Key)
	add("target.columns", a.Target.Columns, b.Target.Columns)
	add("target.mode", a.Target.Mode, b.Target.Mode)
	add("target.duplicates", a.Target.Duplicates, b.Target.Duplicates)
	add("target.conflict", a.Target.Conflict, b.Target.Conflict)
	add("target.version", a.Target.Version, b.Target.Version)
	add("target.valid_from", a.Target.ValidFrom, b.Target.ValidFrom)
	add("target.valid_to", a.Target.ValidTo, b.Target.ValidTo)
	add("target.derive", a.Target.Derive, b.Target.Derive)
	add("target.hash_column", a.Target.HashColumn, b.Target.HashColumn)
	add("target.inserted_by", a.Target.InsertedBy, b.Target.InsertedBy)
	add("target.updated_by", a.Target.UpdatedBy, b.Target.UpdatedBy)
	add("rollback", a.Rollback, b.Rollback)
	add("publish", a.Publish, b.Publish)
	var at, bt PlanTime
	if a.Time != nil {
		at = *a.Time
	}
	if b.Time != nil {
		bt = *b.Time
	}
	add("time.chunk_column", at.ChunkColumn, bt.ChunkColumn)
	add("time.zone", at.Zone, bt.Zone)
	add("time.date_meaning", at.DateMeaning, bt.DateMeaning)
	add("time.event_time", at.EventTime, bt.EventTime)
	add("time.modified_at", at.ModifiedAt, bt.ModifiedAt)
	add("time.ingested_at", at.IngestedAt, bt.IngestedAt)
	if !slices.Equal(a.ChunkIDs, b.ChunkIDs) {
		msg := fmt.Sprintf("chunks: %d -> %d", len(a.ChunkIDs), len(b.ChunkIDs))
		for i := 0; i < min(len(a.ChunkIDs), len(b.ChunkIDs)); i++ {
			if a.ChunkIDs[i] != b.ChunkIDs[i] {
				msg += fmt.Sprintf(", first difference at seq %d: %q -> %q", i, a.ChunkIDs[i], b.ChunkIDs[i])
				break
			}
		}
		d = append(d, msg)
	}
	return d
}

func planChangedError(job string, batchID int64, old, cur Plan) error {
	diff := PlanDiff(old, cur)
	if len(diff) == 0 {
		diff = []string{"fingerprint: " + old.Fingerprint + " -> " + cur.Fingerprint}
	}
	return fmt.Errorf("%w: job %q batch %d was planned differently (%s); set Job.NewRun to start a new run", ErrPlanChanged, job, batchID, strings.Join(diff, "; "))
}
