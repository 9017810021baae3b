package backfill_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// versionedSource is a skipSource whose extractor is a
// backfill.ChunkVersioner: a chunk's version is its generation, bumped
// by every edit of one of its rows (set); it counts the Extract calls
// per chunk.
type versionedSource struct {
	*skipSource
	mu       sync.Mutex
	size     int64         // the chunks' size (100)
	gen      map[int64]int // chunk's Lo / size -> generation
	extracts map[string]int
	versions map[string]int // ChunkVersion calls per chunk
	// fail makes ChunkVersion of the chunk of this ID fail; unknown
	// makes every version "".
	fail    string
	unknown bool
}

func newVersionedSource() *versionedSource {
	return &versionedSource{skipSource: newSkipSource(), size: 100, gen: map[int64]int{}}
}

func (v *versionedSource) set(id int64, name, amount string) {
	v.skipSource.set(id, name, amount)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen[id/v.size]++
}

// calls returns the chunks extracted since the last call, sorted, and
// how many ChunkVersion calls there were, and forgets them.
func (v *versionedSource) calls() ([]string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	ids := slices.Sorted(maps.Keys(v.extracts))
	n := 0
	for _, k := range v.versions {
		n += k
	}
	v.extracts, v.versions = nil, nil
	return ids, n
}

func (v *versionedSource) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	v.mu.Lock()
	if v.extracts == nil {
		v.extracts = map[string]int{}
	}
	v.extracts[c.ID]++
	v.mu.Unlock()
	return v.skipSource.extractor().Extract(ctx, c, w)
}

func (v *versionedSource) ChunkVersion(_ context.Context, c backfill.Chunk) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.versions == nil {
		v.versions = map[string]int{}
	}
	v.versions[c.ID]++
	switch {
	case c.ID == v.fail:
		return "", errors.New("source unreachable")
	case v.unknown:
		return "", nil
	}
	return fmt.Sprintf("gen-%d", v.gen[c.Lo/v.size]), nil
}

var _ backfill.ChunkVersioner = (*versionedSource)(nil)

// versionRunner is a runner of the versioned items job ("leased", with
// Config.ExtractAhead for "leased, extract ahead").
func versionRunner(t *testing.T, s *itemsSetup, src *versionedSource, path string, hooks backfill.Hooks) (*backfill.Runner, backfill.Job) {
	t.Helper()
	cfg := &backfill.Config{Concurrency: 2, Hooks: hooks, ExtractAhead: path == "leased, extract ahead", MaxAttempts: 1}
	job := skipJob(src.skipSource)
	job.Extractor = src
	r, err := backfill.New(s.db, cfg)
	require.NoError(t, err)
	return r, job
}

var versionPaths = []string{"leased", "leased, extract ahead"}

// A replay of an unchanged range with a ChunkVersioner extracts nothing
// and writes nothing to the target; a changed version extracts and
// merges exactly its chunk; a target row changed, deleted or inserted by
// another session under an unchanged version has its chunk extracted and
// merged.
func TestChunkVersionSkipsTheExtraction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, path := range versionPaths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			src := newVersionedSource()
			hooks := &skipHooks{}
			r, job := versionRunner(t, s, src, path, hooks)
			rep1, err := r.Run(ctx, job)
			require.NoError(t, err)
			require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep1.Counts)
			extracted, versions := src.calls()
			require.Len(t, extracted, 10)
			require.Equal(t, 20, versions, "each extracted chunk's version is read before and after its extraction")
			hooks.merged()
			_, err = s.db.Exec(`ALTER TABLE items SET (autovacuum_enabled = off)`)
			require.NoError(t, err)
			_, err = s.db.Exec(`VACUUM (FREEZE) items`)
			require.NoError(t, err)
			first := snapshot(t, s.db)

			walBefore := walMark(t, s.db)
			for range 2 {
				// The second replay skips on the first replay's records
				// (a skipped chunk records the version again).
				rep, err := r.Run(ctx, job)
				require.NoError(t, err)
				extracted, _ = src.calls()
				require.Empty(t, extracted, "Extract called for unchanged versions")
				require.Equal(t, 10, rep.ChunksSkipped)
				require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
				requireBalanced(t, s.db, rep.BatchID)
			}
			if d := cmp.Diff(first, snapshot(t, s.db)); d != "" {
				t.Fatalf("a skipped replay rewrote rows (-want +got):\n%s", d)
			}
			require.Zero(t, targetWAL(t, s.db, walBefore), "WAL records of the target written by the skipped replays")

			// A changed source row: its chunk's version changes.
			src.set(321, "changed", "1.00")
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ = src.calls()
			require.Equal(t, []string{"int:300/400"}, extracted)
			require.Equal(t, []string{"int:300/400"}, hooks.merged())
			require.Equal(t, backfill.Counts{Read: 1000, Updated: 1, Unchanged: 999}, rep.Counts)

			// Target rows changed by another session, versions unchanged.
			_, err = s.db.Exec(`UPDATE items SET name = 'tampered' WHERE id = 555;
				DELETE FROM items WHERE id = 666;
				INSERT INTO items (tenant, id, name) VALUES ('other', 777, 'extra')`)
			require.NoError(t, err)
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			want := []string{"int:500/600", "int:600/700", "int:700/800"}
			extracted, _ = src.calls()
			require.Equal(t, want, extracted)
			require.Equal(t, want, hooks.merged())
			require.Equal(t, 7, rep.ChunksSkipped)
			require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1, Updated: 1, Unchanged: 998}, rep.Counts)
			requireBalanced(t, s.db, rep.BatchID)
			wantRows := append([]rowImage{{Tenant: "other", ID: 777, Name: "extra"}}, src.image()...)
			slices.SortStableFunc(wantRows, func(a, b rowImage) int { return strings.Compare(a.Tenant, b.Tenant) })
			if d := cmp.Diff(wantRows, contentOf(snapshot(t, s.db))); d != "" {
				t.Fatalf("target after the replay (-want +got):\n%s", d)
			}

			// Chunk 700 holds a row the source does not have: it recorded
			// no fingerprints, so it is extracted again; the others skip
			// without extracting.
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ = src.calls()
			require.Equal(t, []string{"int:700/800"}, extracted)
			require.Equal(t, 9, rep.ChunksSkipped)
		})
	}
}

// Cases where the version does not spare the extraction: a rolled back
// base, a base with rejected rows (re-queued by the replay), a version
// "" (unknown); and a ChunkVersion error fails the chunk.
func TestChunkVersionExtractsWhenItMust(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, path := range versionPaths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			s := newItems(t)
			src := newVersionedSource()
			src.skipSource.set(42, "bad", "not a number") // a reject in chunk 0, version unchanged
			r, job := versionRunner(t, s, src, path, nil)
			rep1, err := r.Run(ctx, job)
			require.NoError(t, err)
			src.calls()
			// The base batch rolled back: no base, every chunk is
			// extracted and merged.
			_, err = r.Rollback(ctx, job, backfill.RollbackOptions{BatchID: rep1.BatchID, Actor: "ann", Why: "test"})
			require.NoError(t, err)
			rep, err := r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ := src.calls()
			require.Len(t, extracted, 10)
			require.Zero(t, rep.ChunksSkipped)
			require.Equal(t, backfill.Counts{Read: 1000, Inserted: 999, Rejected: 1}, rep.Counts)

			// The base of chunk 0 rejected a row: extracted (and skipped
			// on its fingerprints, its reject queued in this batch).
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ = src.calls()
			require.Equal(t, []string{"int:0/100"}, extracted)
			require.Equal(t, 10, rep.ChunksSkipped)
			require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 999, Rejected: 1}, rep.Counts)
			ex, err := backfill.NewPGManifest("").Exceptions(ctx, s.db, rep.BatchID)
			require.NoError(t, err)
			require.Len(t, ex, 1)
			require.Equal(t, "int:0/100", ex[0].ChunkID)

			// Unknown versions: every chunk extracted (and skipped on its
			// fingerprints).
			src.unknown = true
			rep, err = r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ = src.calls()
			require.Len(t, extracted, 10)
			require.Equal(t, 10, rep.ChunksSkipped)
			src.unknown = false
			// Recorded "" by then: extracted once more, recording them.
			_, err = r.Run(ctx, job)
			require.NoError(t, err)
			extracted, _ = src.calls()
			require.Len(t, extracted, 10)

			// A failing ChunkVersion: a chunk error naming the chunk.
			src.fail = "int:300/400"
			r1, _ := versionRunner(t, s, src, path, nil)
			_, err = r1.Run(ctx, job)
			require.Error(t, err)
			var ce *backfill.ChunkError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "int:300/400", ce.Chunk.ID)
			require.ErrorContains(t, err, "source unreachable")
			src.fail = ""
		})
	}
}
