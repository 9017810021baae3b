package backfill_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

type binVersion struct{ *versionedSource }

func (b binVersion) ChunkVersion(_ context.Context, c backfill.Chunk) (string, error) {
	return string([]byte{0xde, 0xad, 0x00, 0xbe, 0xef}), nil // e.g. string(md5.Sum(...)[:])
}

// TestChunkVersionTokenMustBeText: a versioner returning raw bytes (not
// UTF-8 text, a NUL among them) fails its chunk at once, before any
// extraction, with an error that names ChunkVersion and the chunk, not
// retried; nothing is loaded. (It once failed only at the checkpoint,
// after the merge, with PostgreSQL's "invalid byte sequence".)
func TestChunkVersionTokenMustBeText(t *testing.T) {
	ctx := context.Background()
	for _, path := range versionPaths {
		t.Run(path, func(t *testing.T) {
			s := newItems(t)
			src := newVersionedSource()
			r, job := versionRunner(t, s, src, path, nil)
			job.Extractor = binVersion{src}
			rep, err := r.Run(ctx, job)
			require.Error(t, err)
			require.Contains(t, err.Error(), "ChunkVersion returned")
			require.Contains(t, err.Error(), "not UTF-8 text without NUL")
			var ce *backfill.ChunkError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, 1, ce.Attempt, "not retried")
			require.Zero(t, rep.ChunksDone)
		})
	}
}
