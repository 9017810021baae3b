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

	"github.com/pgbackfill/backfill/backfilltype"
)

// NewPlan freezes a prepared job into a [Plan] with its fingerprint. info
// is the target as [backfilldriver.Merger.Prepare] resolved it; chunks come
// from the job's Chunker.
func NewPlan(job Job, info TableInfo, chunks []Chunk) Plan {
	p := planOf(job, info)
	ids := make([]string, len(chunks))
	for i, c := range chunks {
		ids[i] = c.ID
	}
	p.ChunkIDs, p.Chunks = ids, chunks
	p.Fingerprint = p.ComputeFingerprint()
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
		Target: backfilltype.PlanTarget{
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
		Approval: planApproval(job),
	}
	pt := backfilltype.PlanTime{ChunkColumn: job.ChunkColumn, DateMeaning: job.DateMeaning,
		EventTime: info.Target.EventTime, ModifiedAt: info.Target.ModifiedAt, IngestedAt: info.Target.IngestedAt}
	if job.Zone != nil {
		pt.Zone = job.Zone.String()
	}
	if pt != (backfilltype.PlanTime{}) {
		p.Time = &pt
	}
	return p
}

// streamPlan freezes job into a plan whose chunks come from s: it reads
// them once (ChunkSeq) for their number and the fingerprint, which is
// that of [NewPlan] of the same chunks, and keeps none of them. The
// plan's Chunks and ChunkIDs are nil; [backfilltype.Plan.Len] and
// [backfilltype.Plan.AllChunks] give its chunks.
func streamPlan(ctx context.Context, job Job, info TableInfo, s ChunkStreamer) (Plan, error) {
	p := planOf(job, info)
	p.Stream = s
	fp, n, err := streamFingerprint(p, s.ChunkSeq(ctx))
	if err != nil {
		return Plan{}, err
	}
	p.Fingerprint, p.N = fp, n
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
