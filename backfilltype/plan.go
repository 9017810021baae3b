package backfilltype

import (
	"fmt"
	"iter"
	"strings"
)

// isRecordedChunk reports whether a is chunk b as recorded: Seq, ID, kind
// and bounds (time bounds as instants: the manifest's are in another
// location).
func isRecordedChunk(a, b Chunk) bool {
	if a.Seq != b.Seq || a.ID != b.ID || a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case KindTime:
		return a.Start.Equal(b.Start) && a.End.Equal(b.End)
	case KindInt:
		return a.Lo == b.Lo && a.Hi == b.Hi
	case KindList:
		return a.Item == b.Item
	}
	return true
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
	var aa, ba PlanApproval
	if a.Approval != nil {
		aa = *a.Approval
	}
	if b.Approval != nil {
		ba = *b.Approval
	}
	add("approval.approvers", aa.Approvers, ba.Approvers)
	add("approval.author_may_approve", aa.AuthorMayApprove, ba.AuthorMayApprove)
	if msg := chunksDiff(a, b); msg != "" {
		d = append(d, msg)
	}
	return d
}

// chunksDiff says how the chunks of plans a and b differ: their number,
// and the first differing ID where both plans know their IDs ("" when
// they do not differ as far as the plans tell).
func chunksDiff(a, b Plan) string {
	ida, idb := a.chunkIDs(), b.chunkIDs()
	if ida == nil || idb == nil {
		// A plan read back from the JSON form of a plan frozen from a
		// ChunkStreamer lists no IDs: its number of chunks tells.
		if a.Len() != b.Len() {
			return fmt.Sprintf("chunks: %d -> %d", a.Len(), b.Len())
		}
		return ""
	}
	nexta, stopa := iter.Pull(ida)
	defer stopa()
	nextb, stopb := iter.Pull(idb)
	defer stopb()
	for i := 0; ; i++ {
		x, oka := nexta()
		y, okb := nextb()
		if !oka && !okb {
			return ""
		}
		if oka && okb && x == y {
			continue
		}
		msg := fmt.Sprintf("chunks: %d -> %d", a.Len(), b.Len())
		if oka && okb {
			msg += fmt.Sprintf(", first difference at seq %d: %q -> %q", i, x, y)
		}
		return msg
	}
}
