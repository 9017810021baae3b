package backfill_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
)

// TestSkipUnchangedNewGround: a chunk whose merge inserted every staged
// row records the transaction that inserted them instead of scanning its
// rows ("inserts:" fingerprints), and a replay skips it only while its
// bounds hold exactly those row versions: a write to one of its rows
// (even to the same value), a row of another key in its bounds, a row
// deleted, each makes exactly that chunk merge, with exact counts, and
// the target ends equal to the source.
func TestSkipUnchangedNewGround(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	src.set(42, "item-42", "bad") // rejected by the row writer: staged = read - rejected
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 999, Rejected: 1}, rep.Counts)
	hooks.merged()
	fps := targetFingerprints(t, ctx, s.db, rep.BatchID)
	require.Len(t, fps, 10)
	for id, fp := range fps {
		want := ":100:100:"
		if id == "int:0/100" {
			want = ":99:99:"
		}
		require.True(t, strings.HasPrefix(fp, "inserts:") && strings.Contains(fp, want), "chunk %s: %q", id, fp)
	}

	// An unchanged replay skips every chunk, its rejects queued again.
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 999, Rejected: 1}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)

	// Same-value update (chunk 100), a row of another key in the bounds
	// (chunk 300), a row deleted (chunk 700, at the end of its bounds).
	for _, q := range []string{
		`UPDATE items SET name = name WHERE tenant = 'acme' AND id = 150`,
		`INSERT INTO items (tenant, id, name) VALUES ('zz', 333, 'intruder')`,
		`DELETE FROM items WHERE tenant = 'acme' AND id = 799`,
	} {
		_, err = s.db.Exec(q)
		require.NoError(t, err, q)
	}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:100/200", "int:300/400", "int:700/800"}, hooks.merged())
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1, Unchanged: 998, Rejected: 1}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	var acme []rowImage
	for _, row := range contentOf(snapshot(t, s.db)) {
		if row.Tenant == "acme" {
			acme = append(acme, row)
		}
	}
	want := src.image()
	want = append(want[:42], want[43:]...)
	if d := cmp.Diff(want, acme); d != "" {
		t.Fatalf("target after the replay (-want +got):\n%s", d)
	}

	// Chunks 100 and 700 merged and recorded their rows anew; chunk 300
	// holds a row it does not stage, and merges each time.
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:300/400"}, hooks.merged())
	require.Equal(t, 9, rep.ChunksSkipped)
}

// TestSkipUnchangedNewGroundConcurrentWriter: another session inserts a
// row of another key into a chunk's bounds and commits after the chunk's
// merge inserted every row and before the chunk records their
// transaction. The recorded fingerprint counts the chunk's own rows
// only, so a replay finds one row more and merges the chunk, every
// replay, never skipping with the foreign row counted as the chunk's.
func TestSkipUnchangedNewGroundConcurrentWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	job := skipJob(src)
	job.Chunker = backfill.IntRange(0, 100, 100)
	for id := int64(100); id < 1000; id++ {
		delete(src.rows, id)
	}
	db := &beforeFingerprintDB{DB: backfill.Postgres(s.db), match: "rewrites", hook: func() {
		_, err := s.db.Exec(`INSERT INTO items (tenant, id, name) VALUES ('zz', 55, 'intruder')`)
		require.NoError(t, err)
	}}
	rw, err := backfill.NewWithDB(db, nil)
	require.NoError(t, err)
	rep, err := rw.Run(ctx, job)
	require.NoError(t, err)
	require.True(t, db.ran, "the concurrent insert ran before the recorded fingerprint")
	require.Equal(t, backfill.Counts{Read: 100, Inserted: 100}, rep.Counts)

	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	for range 2 {
		rep, err = r.Run(ctx, job)
		require.NoError(t, err)
		require.Zero(t, rep.ChunksSkipped, "a chunk skipped with another key's row in its bounds")
		require.Equal(t, backfill.Counts{Read: 100, Unchanged: 100}, rep.Counts)
	}
}

// TestSkipUnchangedNewGroundTrigger: a BEFORE INSERT trigger may store
// other values than the staged ones, so the transaction that inserted a
// chunk's rows does not stand for them: the chunk proves its rows as a
// merge that found them (and here, records nothing), and a replay of
// the same source merges instead of keeping the trigger's values.
func TestSkipUnchangedNewGroundTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	_, err := s.db.Exec(`CREATE FUNCTION shout() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.name := upper(NEW.name); RETURN NEW; END $$;
		CREATE TRIGGER shout BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION shout()`)
	require.NoError(t, err)
	src := newSkipSource()
	job := skipJob(src)
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1000}, rep.Counts)
	for id, fp := range targetFingerprints(t, ctx, s.db, rep.BatchID) {
		require.False(t, strings.HasPrefix(fp, "inserts:"), "chunk %s recorded %q though a trigger changed its rows", id, fp)
	}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped, "chunks skipped on rows a trigger changed")
	require.Equal(t, backfill.Counts{Read: 1000, Updated: 1000}, rep.Counts)
	if d := cmp.Diff(src.image(), contentOf(snapshot(t, s.db))); d != "" {
		t.Fatalf("target after the replay (-want +got):\n%s", d)
	}
}

// TestSkipUnchangedByDefault: a job that sets neither SkipUnchanged nor
// MergeEveryChunk skips unchanged chunks when it is eligible; an
// ineligible job, or a Runner that cannot skip, merges every chunk and
// logs why once per Runner and job; setting both is refused.
func TestSkipUnchangedByDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r, err := backfill.New(s.db, &backfill.Config{Logger: logger})
	require.NoError(t, err)

	job := skipJob(src)
	job.SkipUnchanged = false
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped, "an eligible job skips by default")
	require.Equal(t, backfill.Counts{Read: 1000, Unchanged: 1000}, rep.Counts)
	require.NotContains(t, logs.String(), "merged, not skipped")

	// Ineligible (a validator the fingerprints do not prove): it merges,
	// and says why once.
	inel := job
	inel.Name = "ineligible"
	inel.Validators = []backfill.Validator{backfill.ValidatorFunc(func(context.Context, sqlx.ExtContext, backfill.ValidationScope) (backfill.CheckResult, error) {
		return backfill.CheckResult{Check: "mine", Passed: true}, nil
	})}
	for range 3 {
		rep, err = r.Run(ctx, inel)
		require.NoError(t, err)
		require.Zero(t, rep.ChunksSkipped)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "merged, not skipped"), logs.String())
	require.Contains(t, logs.String(), "ValidatorFunc")
	// Asked for, the same job is refused.
	inel.SkipUnchanged = true
	_, err = r.Run(ctx, inel)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	// Without ChunkColumn: merged by default, said once; skipped when
	// asked for.
	keys := job
	keys.Name, keys.ChunkColumn = "keys", ""
	for range 2 {
		rep, err = r.Run(ctx, keys)
		require.NoError(t, err)
		require.Zero(t, rep.ChunksSkipped)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "no ChunkColumn"), logs.String())
	keys.SkipUnchanged = true
	rep, err = r.Run(ctx, keys)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped) // its base recorded nothing
	rep, err = r.Run(ctx, keys)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)

	// MergeEveryChunk: merged, nothing recorded.
	off := job
	off.MergeEveryChunk = true
	rep, err = r.Run(ctx, off)
	require.NoError(t, err)
	require.Zero(t, rep.ChunksSkipped)
	require.Empty(t, targetFingerprints(t, ctx, s.db, rep.BatchID))
	off.SkipUnchanged = true
	_, err = r.Run(ctx, off)
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)

	// A Runner whose manifest cannot skip: merged, said once.
	pm := backfill.NewPGManifest("")
	r, err = backfill.New(s.db, &backfill.Config{Manifest: manifestOnly{pm, pm}, Logger: logger})
	require.NoError(t, err)
	job.Rollback = backfill.RollbackNone
	for range 2 {
		rep, err = r.Run(ctx, job)
		require.NoError(t, err)
		require.Zero(t, rep.ChunksSkipped)
	}
	require.Equal(t, 3, strings.Count(logs.String(), "merged, not skipped"), logs.String())
	require.Contains(t, logs.String(), "ManifestSkips")
}

// logBuffer is a log sink safe for concurrent writers.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestSkipUnchangedNewGroundWithoutChunkColumn: without ChunkColumn the
// rows of a chunk are those of its identities; a first load records the
// transaction that inserted them, and a replay skips a chunk only while
// its identities' rows are those row versions.
func TestSkipUnchangedNewGroundWithoutChunkColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	src := newSkipSource()
	hooks := &skipHooks{}
	r, err := backfill.New(s.db, &backfill.Config{Hooks: hooks})
	require.NoError(t, err)
	job := skipJob(src)
	job.ChunkColumn = ""
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	hooks.merged()
	for id, fp := range targetFingerprints(t, ctx, s.db, rep.BatchID) {
		require.True(t, strings.HasPrefix(fp, "inserts:") && strings.Contains(fp, ":100:100:"), "chunk %s: %q", id, fp)
	}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
	hooks.merged()

	for _, q := range []string{
		`UPDATE items SET name = name WHERE tenant = 'acme' AND id = 100`,
		`DELETE FROM items WHERE tenant = 'acme' AND id = 555`,
		`INSERT INTO items (tenant, id, name) VALUES ('zz', 333, 'other key')`,
	} {
		_, err = s.db.Exec(q)
		require.NoError(t, err, q)
	}
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, []string{"int:100/200", "int:500/600"}, hooks.merged())
	require.Equal(t, backfill.Counts{Read: 1000, Inserted: 1, Unchanged: 999}, rep.Counts)
	requireBalanced(t, s.db, rep.BatchID)
	rep, err = r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, 10, rep.ChunksSkipped)
}
