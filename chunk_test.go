package backfill_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestChunkContainsWrongType: a time chunk contains time.Time values
// only; text, NULL and pointers are outside it.
func TestChunkContainsWrongType(t *testing.T) {
	t.Parallel()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	c := mustChunks(t, backfill.Days(start, start.AddDate(0, 0, 1), time.UTC))[0]
	require.True(t, c.Contains(start))
	require.False(t, c.Contains("2024-01-01"))
	require.False(t, c.Contains(nil))
	require.False(t, c.Contains(&start))
}
