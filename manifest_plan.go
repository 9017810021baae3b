package backfill

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"strings"
)

// NewPlan freezes a prepared job into a [Plan] with its fingerprint. info
// is the target as [Merger.Prepare] resolved it; chunks come from the
// job's Chunker.
func NewPlan(job Job, info TableInfo, chunks []Chunk) Plan {
	p := planOf(job, info)
	ids := make([]string, len(chunks))
	for i, c := range chunks {
		ids[i] = c.ID
	}
	p.ChunkIDs, p.Chunks = ids, chunks
	p.Fingerprint = p.fingerprint()
	return p
}

// planOf is the plan of job without its chunks or fingerprint.
func planOf(job Job, info TableInfo) Plan {
	cols := make([]string, info.Written)
	for i, c := range info.Columns[:info.Written] {
		cols[i] = c.Name
	}
	var derive []string
	for _, r := range info.Target.Derive {
		derive = append(derive, r.String())
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
	}
	pt := PlanTime{ChunkColumn: job.ChunkColumn, DateMeaning: job.DateMeaning,
		EventTime: info.Target.EventTime, ModifiedAt: info.Target.ModifiedAt, IngestedAt: info.Target.IngestedAt}
	if job.Zone != nil {
		pt.Zone = job.Zone.String()
	}
	if pt != (PlanTime{}) {
		p.Time = &pt
	}
	return p
}

// streamPlan freezes job into a plan whose chunks come from s: it reads
// them once (ChunkSeq) for their number and the fingerprint, which is
// that of [NewPlan] of the same chunks, and keeps none of them. The
// plan's Chunks and ChunkIDs are nil; [Plan.Len] and [Plan.AllChunks]
// give its chunks.
func streamPlan(ctx context.Context, job Job, info TableInfo, s ChunkStreamer) (Plan, error) {
	p := planOf(job, info)
	p.stream = s
	fp, n, err := streamFingerprint(p, s.ChunkSeq(ctx))
	if err != nil {
		return Plan{}, err
	}
	p.Fingerprint, p.n = fp, n
	return p, nil
}

// chunkIDsField is how the JSON form of a plan with no chunk IDs (but
// not nil ones) shows them; it cannot occur inside a JSON string, in
// which every quote is escaped.
const chunkIDsField = `"chunk_ids":[]`

// streamFingerprint returns the fingerprint p would have with the IDs of
// chunks as its ChunkIDs (the hex SHA-256 of its JSON form), and their
// number, hashing the JSON as it is written: the part before the IDs,
// each ID as encoding/json writes a string, the part after.
func streamFingerprint(p Plan, chunks iter.Seq2[Chunk, error]) (string, int, error) {
	p.ChunkIDs, p.Chunks = []string{}, nil
	b, err := json.Marshal(p)
	if err != nil { // only plain strings and slices: cannot happen
		panic(err)
	}
	i := bytes.Index(b, []byte(chunkIDsField))
	if i < 0 {
		panic("backfill: plan JSON without " + chunkIDsField)
	}
	h := sha256.New()
	h.Write(b[:i+len(chunkIDsField)-1])
	n := 0
	for c, err := range chunks {
		if err != nil {
			return "", 0, err
		}
		if c.Seq != n {
			return "", 0, fmt.Errorf("%w: chunk %s has Seq %d at position %d", ErrInvalidScope, c.ID, c.Seq, n)
		}
		id, err := json.Marshal(c.ID)
		if err != nil {
			panic(err) // a string: cannot happen
		}
		if n > 0 {
			h.Write([]byte{','})
		}
		h.Write(id)
		n++
	}
	if n == 0 {
		return "", 0, fmt.Errorf("%w: no chunks", ErrEmptyScope)
	}
	h.Write(b[i+len(chunkIDsField)-1:])
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Len returns the number of chunks of the plan: of Chunks, of a plan
// read back from the manifest's JSON form (its ChunkIDs, none for a plan
// frozen from a [ChunkStreamer]), or of a plan a Runner froze from a
// [ChunkStreamer], whose Chunks is nil.
func (p Plan) Len() int {
	switch {
	case p.Chunks != nil:
		return len(p.Chunks)
	case p.ChunkIDs != nil:
		return len(p.ChunkIDs)
	}
	return p.n
}

// AllChunks yields the plan's chunks in Seq order: Chunks, or, for a plan
// a Runner froze from a [ChunkStreamer], the chunker's chunks one at a
// time (a [Manifest] inserts a long plan's chunks this way, without
// holding them all). An error of the chunker is yielded with a zero
// Chunk and ends the sequence.
func (p Plan) AllChunks(ctx context.Context) iter.Seq2[Chunk, error] {
	if p.stream == nil {
		return func(yield func(Chunk, error) bool) {
			for _, c := range p.Chunks {
				if !yield(c, nil) {
					return
				}
			}
		}
	}
	return p.stream.ChunkSeq(ctx)
}

// chunkOf returns the plan's chunk that the manifest recorded as c, or
// false when c is not the plan's chunk of its Seq. A streamer's ChunkOf
// is held to its contract: the chunk it returns must be c itself (Seq,
// ID, kind and bounds), or the run would extract one chunk and
// checkpoint another.
func (p Plan) chunkOf(c Chunk) (Chunk, bool) {
	if p.stream != nil {
		got, ok := p.stream.ChunkOf(c)
		if !ok || !isRecordedChunk(got, c) {
			return Chunk{}, false
		}
		return got, true
	}
	if c.Seq < 0 || c.Seq >= len(p.Chunks) || p.Chunks[c.Seq].ID != c.ID {
		return Chunk{}, false
	}
	return p.Chunks[c.Seq], true
}

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

func (p Plan) fingerprint() string {
	b, err := json.Marshal(p)
	if err != nil { // only plain strings and slices: cannot happen
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// skipKey is the key under which a replay with [Job.SkipUnchanged] looks
// up a chunk's base load (ManifestSkips.BaseFingerprints): the hex SHA-256
// of the plan's JSON form without its scope and chunk IDs (the job name,
// source, code version, target table, key, written columns, mode,
// duplicate and conflict policies, version, validity columns, derived
// keys, hash column, lineage columns, rollback mechanism, publish mode
// and time declarations), and of the declared type and collation of
// every column of info, the table merged into. Two runs of a job with the
// same key determine a chunk's merge the same way from the same rows, so
// the chunk (its ID names its bounds) may skip on the other's
// fingerprints whatever scope either run covered: a replay of part of a
// loaded range, or of a range extended by new chunks, skips the chunks
// already loaded. Any other field of the plan changes the key: nothing
// skips on a base loaded otherwise.
func (p Plan) skipKey(info TableInfo) string {
	type column struct {
		Name      string `json:"name"`
		Type      string `json:"type"`
		BaseType  string `json:"base_type"`
		Collation string `json:"collation,omitempty"`
	}
	k := struct {
		Plan    Plan     `json:"plan"`
		Columns []column `json:"columns"`
	}{Plan: p}
	k.Plan.Scope, k.Plan.ChunkIDs = "", nil
	for _, c := range info.Columns {
		k.Columns = append(k.Columns, column{Name: c.Name, Type: c.Type, BaseType: c.BaseType, Collation: c.Collation})
	}
	b, err := json.Marshal(k)
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

// chunkIDs yields the plan's chunk IDs, from ChunkIDs, Chunks or its
// ChunkStreamer; nil when the plan does not know them (read back from
// the JSON form of a plan frozen from a ChunkStreamer). A chunker's
// error ends the IDs.
func (p Plan) chunkIDs() iter.Seq[string] {
	switch {
	case p.ChunkIDs != nil:
		return slices.Values(p.ChunkIDs)
	case p.Chunks == nil && p.stream == nil:
		return nil
	}
	return func(yield func(string) bool) {
		for c, err := range p.AllChunks(context.Background()) {
			if err != nil || !yield(c.ID) {
				return
			}
		}
	}
}

func planChangedError(job string, batchID int64, old, cur Plan) error {
	diff := PlanDiff(old, cur)
	if len(diff) == 0 {
		diff = []string{"fingerprint: " + old.Fingerprint + " -> " + cur.Fingerprint}
	}
	return fmt.Errorf("%w: job %q batch %d was planned differently (%s); set Job.NewRun to start a new run", ErrPlanChanged, job, batchID, strings.Join(diff, "; "))
}
