package backfill_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// etagSource: a ChunkVersioner whose version is a content hash of the
// chunk's source rows (an ETag): equal tokens at two times do mean equal
// rows, as ChunkVersioner asks. duringExtract, when set, runs once at the
// start of the next Extract (the source changing between the version
// read and the extraction).
type etagSource struct {
	*skipSource
	mu            sync.Mutex
	duringExtract func()
}

func (e *etagSource) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	e.mu.Lock()
	f := e.duringExtract
	e.duringExtract = nil
	e.mu.Unlock()
	if f != nil {
		f()
	}
	return e.skipSource.extractor().Extract(ctx, c, w)
}

func (e *etagSource) ChunkVersion(_ context.Context, c backfill.Chunk) (string, error) {
	e.skipSource.mu.Lock()
	defer e.skipSource.mu.Unlock()
	h := sha256.New()
	for id := c.Lo; id < c.Hi; id++ {
		if r, ok := e.skipSource.rows[id]; ok {
			fmt.Fprintf(h, "%d|%s|%s\n", id, r[0], r[1])
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// TestChunkVersionChangedDuringExtractionIsNotRecorded: the source
// changes between the version read and the extraction (a content-hash
// version, which comes back when the content does). The version read
// before is not recorded with the other rows' fingerprints (the version
// is read again after the extraction); when the source returns to the
// rows of that version, the next replay extracts and restores them. (It
// once skipped and kept the other rows.)
func TestChunkVersionChangedDuringExtractionIsNotRecorded(t *testing.T) {
	ctx := context.Background()
	s := newItems(t)
	src := &etagSource{skipSource: newSkipSource()}
	job := skipJob(src.skipSource)
	job.Chunker = backfill.IntRange(0, 100, 100) // one chunk
	job.Extractor = src
	r, err := backfill.New(s.db, &backfill.Config{Concurrency: 1})
	require.NoError(t, err)
	_, err = r.Run(ctx, job) // B1: source A
	require.NoError(t, err)

	src.set(7, "C", "7.00") // source C: version(C)
	orig := src.rows[7]
	src.duringExtract = func() { src.set(7, "D", "7.00") } // changes after the version read
	rep2, err := r.Run(ctx, job)                           // B2: version(C) recorded with rows D
	require.NoError(t, err)
	t.Logf("B2 counts %+v", rep2.Counts)

	src.set(7, orig[0], orig[1]) // the source is back to C: version(C) again
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	t.Logf("B3 skipped=%d counts %+v", rep3.ChunksSkipped, rep3.Counts)
	var name string
	require.NoError(t, s.db.Get(&name, `SELECT name FROM items WHERE id = 7`))
	require.Equal(t, orig[0], name, "target kept row 7 from a source state the version does not describe")
}
