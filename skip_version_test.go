package backfill_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
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
// Config.SerialExtract except for "leased, extract ahead").
func versionRunner(t *testing.T, s *itemsSetup, src *versionedSource, path string, hooks backfill.Hooks) (*backfill.Runner, backfill.Job) {
	t.Helper()
	cfg := &backfill.Config{Concurrency: 2, Hooks: hooks, SerialExtract: path != "leased, extract ahead", MaxAttempts: 1}
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

// TestLeastPrivilegeChunkVersion: a role with DML only (no ownership, no
// CREATE, no DELETE on the target), extracting ahead at Concurrency 2: an
// unchanged replay with a ChunkVersioner extracts nothing and skips every
// chunk; a changed target row and a changed source row each make exactly
// their chunk extracted and merged.
func TestLeastPrivilegeChunkVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newLeastRole(t)
	r.exec(t, `CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	require.NoError(t, backfill.NewPGManifest("").Init(ctx, r.admin))
	r.exec(t, `GRANT USAGE ON SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA backfill TO {role}`)
	r.exec(t, `GRANT EXECUTE ON FUNCTION backfill.record_event(bigint, text, text, text, jsonb), backfill.library_control(bigint, text, text) TO {role}`)
	r.exec(t, `GRANT SELECT, INSERT, UPDATE ON items TO {role}`)
	runner, err := backfill.New(r.db, &backfill.Config{Concurrency: 2})
	require.NoError(t, err)
	src := newVersionedSource()
	job := skipJob(src.skipSource)
	job.Extractor = src
	_, err = runner.Run(ctx, job)
	require.NoError(t, err)
	src.calls()
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ := src.calls()
	require.Empty(t, ex)
	require.Equal(t, 10, rep.ChunksSkipped)
	r.admin.MustExec(`UPDATE items SET name = 'x' WHERE id = 420`)
	src.set(130, "c", "1.00")
	rep, err = runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ = src.calls()
	require.Equal(t, []string{"int:100/200", "int:400/500"}, ex)
	require.Equal(t, 8, rep.ChunksSkipped)
}

// TestPoolerChunkVersion: the same through PgBouncer in transaction mode
// at Concurrency 4, as many chunks as the pooler's server connections,
// extracting ahead; the changed target row is restored.
func TestPoolerChunkVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewPoolerURL(t))
	defer db.Close()
	db.MustExec(`CREATE TABLE items (tenant text NOT NULL, id bigint NOT NULL, name varchar(12), amount numeric(10,2), seen_at timestamptz,
		backfill_inserted_by bigint, backfill_updated_by bigint, PRIMARY KEY (tenant, id))`)
	runner, err := backfill.New(db, &backfill.Config{Concurrency: pgtest.PoolerPoolSize})
	require.NoError(t, err)
	src := newVersionedSource()
	job := skipJob(src.skipSource)
	job.Extractor = src
	_, err = runner.Run(ctx, job)
	require.NoError(t, err)
	src.calls()
	db.MustExec(`UPDATE items SET name = 'x' WHERE id = 420`)
	src.set(130, "c", "1.00")
	rep, err := runner.Run(ctx, job)
	require.NoError(t, err)
	ex, _ := src.calls()
	require.Equal(t, []string{"int:100/200", "int:400/500"}, ex)
	require.Equal(t, 8, rep.ChunksSkipped)
	var n string
	require.NoError(t, db.Get(&n, `SELECT name FROM items WHERE id = 420`))
	require.NotEqual(t, "x", n)
}

// slowVersions is a versionedSource whose ChunkVersion takes 100 ms, so
// that a kill -9 lands in the middle of a replay that skips on versions.
type slowVersions struct{ *versionedSource }

func (s slowVersions) ChunkVersion(ctx context.Context, c backfill.Chunk) (string, error) {
	time.Sleep(100 * time.Millisecond)
	return s.versionedSource.ChunkVersion(ctx, c)
}

// versionKillJob is a replay over a source in which item 450 changed
// since the load: chunk int:400/500 is extracted and merged, the nine
// others skip on their versions.
func versionKillJob() (backfill.Job, *versionedSource) {
	src := newVersionedSource()
	src.set(450, "changed", "4.50")
	job := skipJob(src.skipSource)
	job.Extractor = slowVersions{src}
	return job, src
}

func init() {
	childProcess("BACKFILL_VERSION_KILL_CHILD", func(db *sqlx.DB) error {
		cfg := skipKillConfig()
		r, err := backfill.New(db, cfg)
		if err != nil {
			return err
		}
		job, _ := versionKillJob()
		_, err = r.Run(context.Background(), job)
		return err
	})
}

// TestChunkVersionKilledMidReplay: the version is written only by the
// chunk's checkpoint statement. A kill -9 in the middle of a replay that
// skips on versions (extracting ahead), then a resume: every chunk is done
// once and balanced, nine skipped; every chunk of the batch recorded its
// version, and a further replay extracts nothing and skips all ten.
func TestChunkVersionKilledMidReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewURL(t)
	db := sqlx.MustOpen("postgres", url)
	defer db.Close()
	createItems(t, db)
	r, err := backfill.New(db, skipKillConfig())
	require.NoError(t, err)
	first := newVersionedSource()
	load := skipJob(first.skipSource)
	load.Extractor = first
	rep1, err := r.Run(ctx, load)
	require.NoError(t, err)
	killChildWhen(t, db, "BACKFILL_VERSION_KILL_CHILD", url, `SELECT count(*) FROM backfill.chunks WHERE batch_id > 1 AND status = 'done'`, 4)

	job, src := versionKillJob()
	job.NewRun = false
	rep2, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.True(t, rep2.Resumed)
	require.NotEqual(t, rep1.BatchID, rep2.BatchID)
	require.Less(t, rep2.ChunksRun, 10, "the killed call checkpointed some chunks")
	require.Equal(t, 9, rep2.ChunksSkipped)
	requireBalanced(t, db, rep2.BatchID)
	var missing int
	require.NoError(t, db.Get(&missing, `SELECT count(*) FROM backfill.chunks WHERE batch_id = $1 AND (status <> 'done' OR coalesce(source_version, '') = '')`, rep2.BatchID))
	require.Zero(t, missing, "chunks of the resumed batch not done, or done without their version")
	var name string
	require.NoError(t, db.Get(&name, `SELECT name FROM items WHERE id = 450`))
	require.Equal(t, "changed", name)

	src.calls()
	job.NewRun = true
	rep3, err := r.Run(ctx, job)
	require.NoError(t, err)
	extracted, _ := src.calls()
	require.Empty(t, extracted, "a replay after the resumed one extracted chunks")
	require.Equal(t, 10, rep3.ChunksSkipped)
}

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
