package backfill_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
