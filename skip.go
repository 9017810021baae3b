package backfill

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/spool"
)

// Replays that skip unchanged chunks ([Job.SkipUnchanged]). A chunk is
// checkpointed without staging or merging when both hold:
//
//  1. its source rows, as the extractor wrote them (before conversion),
//     hash as a multiset as at the last load of the same job, chunk ID
//     and skip key (its base): summed in Go by the row writer, or by a
//     probe that neither converts nor spools them (skip_probe.go), no
//     round trip;
//  2. its target rows (within its ChunkColumn bounds, or of its
//     identities without one) hash as the base recorded after its merge,
//     read in the chunk's transaction, after the claim or the fence.
//
// Invariants: a base's fingerprints are recorded only when the statement
// that takes them proves the target rows equal to the staged rows (so a
// skip never keeps a change a merge would undo); any mismatch stages the
// spool and merges as without the option; a skipped chunk writes no
// target row, lineage or undo entry, and records the delivered summary
// its merge would have. Eligibility is [Runner.skipEligible]; the run
// paths call [execution.skipUnchanged]. The design note
// docs/design/skip-unchanged.md explains the alternatives.

// spoolKeys returns the identity of every row of sp (converted rows of
// info), as pgstore.SpoolKeyText forms, one slice per identity column.
func spoolKeys(ctx context.Context, sp *spool.Spool, info TableInfo) ([][]string, error) {
	identity := info.Identity()
	idx := make([]int, len(identity))
	for i, n := range identity {
		idx[i] = slices.IndexFunc(info.Columns, func(c Column) bool { return c.Name == n })
		if idx[i] < 0 {
			return nil, fmt.Errorf("backfill: identity column %q is not a column of %s", n, info.Target.Table)
		}
	}
	keys := make([][]string, len(identity))
	for i := range keys {
		keys[i] = make([]string, 0, sp.Len())
	}
	err := sp.Replay(ctx, func(_ int64, values []any) error {
		for i, j := range idx {
			keys[i] = append(keys[i], pgstore.SpoolKeyText(info.Columns[j], values[j]))
		}
		return nil
	})
	return keys, err
}
