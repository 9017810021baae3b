package backfill

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSpanIndexMatchesBruteForce: the chunks a child's chunk waits for,
// found by binary search, are those a comparison of every pair finds,
// for time, int and list chunks and across kinds.
func TestSpanIndexMatchesBruteForce(t *testing.T) {
	ctx := context.Background()
	day := time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)
	chunks := func(c Chunker) []*graphChunk {
		cs, err := c.Chunks(ctx)
		require.NoError(t, err)
		out := make([]*graphChunk, len(cs))
		for i, c := range cs {
			out[i] = &graphChunk{c: c}
		}
		// Plan order need not be bound order.
		out[0], out[len(out)-1] = out[len(out)-1], out[0]
		return out
	}
	sets := map[string][]*graphChunk{
		"days":   chunks(Days(day, day.AddDate(0, 0, 20), time.UTC)),
		"hours":  chunks(Hours(day.Add(-5*time.Hour), day.AddDate(0, 0, 3), time.UTC)),
		"ints7":  chunks(IntRange(0, 100, 7)),
		"ints10": chunks(IntRange(-5, 95, 10)),
		"list":   chunks(List("a", "b")),
	}
	for pn, parent := range sets {
		idx := newSpanIndex(parent)
		for cn, child := range sets {
			for _, c := range child {
				var want []string
				for _, p := range parent {
					if overlaps(c.c, p.c) {
						want = append(want, p.c.ID)
					}
				}
				var got []string
				for _, p := range idx.overlapping(c, nil) {
					got = append(got, p.c.ID)
				}
				require.ElementsMatch(t, want, got, "child %s %s, parent %s", cn, c.c.ID, pn)
				if c.c.Kind != parent[0].c.Kind || c.c.Kind == "list" {
					require.Len(t, got, len(parent), "a chunk of another kind waits for the whole parent")
				}
			}
		}
	}
}
