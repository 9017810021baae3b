package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// streamTestInfo is a prepared target with every field of the plan's
// JSON form set, for fingerprints.
func streamTestInfo() TableInfo {
	return TableInfo{Target: Target{Table: `t<&>"x"`, Key: []string{"id"}, Mode: Upsert, HashColumn: "h",
		Lineage: Lineage{InsertedBy: "ib", UpdatedBy: "ub"}},
		Columns: []Column{{Name: "id"}, {Name: "v"}}, Written: 2}
}

// TestStreamedFingerprintIsNewPlans: a plan frozen from a ChunkStreamer
// (streamPlan: the IDs hashed as they come) has the fingerprint NewPlan
// gives the same chunks held in memory, for int, list (items with
// characters encoding/json escapes) and time chunkers, and ChunkOf
// restores each chunk as the manifest records it (a time chunk's bounds
// in UTC) and refuses one that is not the scope's. Runs recorded by
// earlier versions resume only if the fingerprints are equal.
func TestStreamedFingerprintIsNewPlans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(t *rapid.T) {
		var ch Chunker
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			lo := rapid.Int64Range(-1000, 1000).Draw(t, "lo")
			ch = IntRange(lo, lo+rapid.Int64Range(1, 3000).Draw(t, "span"), rapid.Int64Range(1, 200).Draw(t, "step"))
		case 1:
			items := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z<>&"\\é\x{2028}\x01 ]{1,6}`), 1, 40, rapid.ID).Draw(t, "items")
			ch = List(items...)
		default:
			start := time.Date(2024, 1, 1, 0, 0, 0, 0, ny).Add(time.Duration(rapid.IntRange(0, 400).Draw(t, "start")) * time.Hour)
			end := start.Add(time.Duration(rapid.IntRange(1, 3000).Draw(t, "hours")) * time.Hour)
			ch = []Chunker{Hours(start, end, ny), Days(start, end, ny), Months(start, end.AddDate(0, 3, 0), ny),
				Every(start, end, 90*time.Minute, ny)}[rapid.IntRange(0, 3).Draw(t, "unit")]
		}
		job := Job{Name: "j", Source: "s", CodeVersion: "v", Chunker: ch, Rollback: RollbackNone}
		chunks, err := ch.Chunks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := NewPlan(job, streamTestInfo(), chunks)
		s := ch.(ChunkStreamer)
		got, err := streamPlan(ctx, job, streamTestInfo(), s)
		if err != nil {
			t.Fatal(err)
		}
		if got.Fingerprint != want.Fingerprint || got.Len() != len(chunks) || got.Chunks != nil || got.ChunkIDs != nil {
			t.Fatalf("streamed plan: fingerprint %s, %d chunks; NewPlan: %s, %d", got.Fingerprint, got.Len(), want.Fingerprint, len(chunks))
		}
		var seq []Chunk
		for c, err := range got.AllChunks(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			seq = append(seq, c)
		}
		if !slices.EqualFunc(seq, chunks, sameChunk) {
			t.Fatalf("ChunkSeq differs from Chunks")
		}
		for _, c := range chunks {
			rec := c
			rec.Start, rec.End = c.Start.UTC(), c.End.UTC() // as read back from timestamptz
			back, ok := s.ChunkOf(rec)
			if !ok || !sameChunk(back, c) || back.Start.Location() != c.Start.Location() {
				t.Fatalf("ChunkOf(%v) = %v, %v; want %v", rec, back, ok, c)
			}
			other := rec
			other.Seq++
			if c.Kind == backfilltype.KindTime {
				other.Seq, other.End = c.Seq, c.End.Add(time.Minute)
			}
			if _, ok := s.ChunkOf(other); ok {
				t.Fatalf("ChunkOf(%v) is a chunk of the scope", other)
			}
			if c.Kind == backfilltype.KindTime && c.Seq+1 < len(chunks) {
				// Two chunks as one: bounds of the scope, not a chunk's.
				two := rec
				two.End = chunks[c.Seq+1].End
				two.ID = "time:" + c.Start.Format(time.RFC3339Nano) + "/" + chunks[c.Seq+1].End.Format(time.RFC3339Nano)
				if _, ok := s.ChunkOf(two); ok {
					t.Fatalf("ChunkOf(%v) is a chunk of the scope", two)
				}
			}
		}
	})
}

func sameChunk(a, b Chunk) bool {
	return a.ID == b.ID && a.Seq == b.Seq && a.Kind == b.Kind && a.Start.Equal(b.Start) && a.End.Equal(b.End) &&
		a.Start.Location() == b.Start.Location() && a.Lo == b.Lo && a.Hi == b.Hi && a.Item == b.Item
}

// TestPlanFingerprintGolden: the fingerprint of a fixed plan, as
// versions before streamed plans computed it (hex SHA-256 of the JSON
// with every chunk ID listed), is unchanged, both held and streamed: a
// run those versions recorded still resumes.
func TestPlanFingerprintGolden(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const golden = "a0a3420b8c365fe88edb0de8c1107f0e5508f87f5f28533fb97fa429bfa42ce4" // computed by the version before streamed plans
	job := Job{Name: "j", Source: "s", CodeVersion: "v", Chunker: List("a", "b<c", "é&\""), Rollback: RollbackNone}
	chunks, err := job.Chunker.Chunks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fp := NewPlan(job, streamTestInfo(), chunks).Fingerprint; fp != golden {
		t.Errorf("NewPlan fingerprint %s, want %s", fp, golden)
	}
	p, err := streamPlan(ctx, job, streamTestInfo(), job.Chunker.(ChunkStreamer))
	if err != nil || p.Fingerprint != golden {
		t.Errorf("streamed fingerprint %s, %v; want %s", p.Fingerprint, err, golden)
	}
}

// noChunks is a ChunkStreamer whose Chunks fails the test: a Runner
// must plan, claim and resume from ChunkSeq and ChunkOf.
type noChunks struct {
	ChunkStreamer
	t     *testing.T
	calls atomic.Int32 // ChunkSeq calls
	// failAt, when positive, makes the failAt-th ChunkSeq fail after
	// insertChunksBatch+5 chunks.
	failAt int32
}

func (c *noChunks) Chunks(context.Context) ([]Chunk, error) {
	c.t.Error("Chunks of a ChunkStreamer called: every chunk held in memory")
	return nil, errors.New("Chunks called")
}

func (c *noChunks) ChunkSeq(ctx context.Context) iter.Seq2[Chunk, error] {
	call := c.calls.Add(1)
	return func(yield func(Chunk, error) bool) {
		for ch, err := range c.ChunkStreamer.ChunkSeq(ctx) {
			if err == nil && call == c.failAt && ch.Seq == pgstore.InsertChunksBatch+5 {
				yield(Chunk{}, errors.New("source went away"))
				return
			}
			if !yield(ch, err) {
				return
			}
		}
	}
}

// TestRunStreamsChunks: a Runner plans, runs, fails part way and resumes
// in a fresh Runner a job of int chunks and one of days in a zone with
// a daylight-saving change, never calling Chunks of its ChunkStreamer:
// every chunk it extracts is the chunker's (a day's bounds in the
// chunker's location), each loaded once. The plan recorded in the
// manifest lists no chunk IDs (its chunk rows do).
func TestRunStreamsChunks(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	day0 := time.Date(2024, 3, 1, 0, 0, 0, 0, ny)
	for name, ch := range map[string]Chunker{
		"int":  IntRange(0, 40, 1),
		"days": Days(day0, day0.AddDate(0, 0, 40), ny),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			db.MustExec(`CREATE TABLE streamed (id bigint PRIMARY KEY, chunk text NOT NULL)`)
			want, err := ch.Chunks(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var fail atomic.Bool
			fail.Store(true)
			job := Job{Name: "streamed", Chunker: &noChunks{ChunkStreamer: ch.(ChunkStreamer), t: t}, Rollback: RollbackNone,
				Target: Target{Table: "streamed", Key: []string{"id"}},
				Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
					if c.Seq == 25 && fail.Load() {
						return errors.New("extractor down")
					}
					if !sameChunk(c, want[c.Seq]) {
						return fmt.Errorf("chunk %v is not the plan's %v", c, want[c.Seq])
					}
					return w.Write(ctx, int64(c.Seq), c.ID)
				}),
			}
			r1, err := New(db, &Config{WorkerID: "w1", MaxAttempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := r1.Run(ctx, job)
			if err == nil || !strings.Contains(err.Error(), "extractor down") {
				t.Fatalf("first run: %v", err)
			}
			fail.Store(false)
			r2, err := New(db, &Config{WorkerID: "w2"})
			if err != nil {
				t.Fatal(err)
			}
			again, err := r2.Run(ctx, job)
			if err != nil || !again.Resumed || again.BatchID != rep.BatchID || again.Status != RunCompleted || again.ChunksDone != len(want) {
				t.Fatalf("resume: %+v, %v", again, err)
			}
			var n, distinct int
			if err := db.QueryRow(`SELECT count(*), count(DISTINCT chunk) FROM streamed`).Scan(&n, &distinct); err != nil || n != len(want) || distinct != len(want) {
				t.Fatalf("target: %d rows, %d chunks, %v; want %d", n, distinct, err, len(want))
			}
			var ids *string
			if err := db.QueryRow(`SELECT plan->>'chunk_ids' FROM backfill.runs WHERE batch_id = $1`, rep.BatchID).Scan(&ids); err != nil || ids != nil {
				t.Fatalf("runs.plan chunk_ids %v, %v; want null", ids, err)
			}
		})
	}
}

// TestResumeOfRunRecordedWithChunkIDs: a run recorded by a version that
// held every chunk (its plan's JSON lists every chunk ID: here a Chunker
// that is not a ChunkStreamer, which still plans that way) resumes when
// the same job is run with the built-in ChunkStreamer; a changed scope
// is refused naming the chunks' change.
func TestResumeOfRunRecordedWithChunkIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE old_plan (id bigint PRIMARY KEY)`)
	var fail atomic.Bool
	fail.Store(true)
	job := Job{Name: "old_plan", Chunker: heldChunker{IntRange(0, 30, 1)}, Rollback: RollbackNone,
		Target: Target{Table: "old_plan", Key: []string{"id"}},
		Extractor: ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
			if c.Seq == 12 && fail.Load() {
				return errors.New("extractor down")
			}
			return w.Write(ctx, c.Lo)
		}),
	}
	r, err := New(db, &Config{WorkerID: "w", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(ctx, job)
	if err == nil {
		t.Fatal("first run did not fail")
	}
	var ids []string
	var raw []byte
	if err := db.QueryRow(`SELECT plan->'chunk_ids' FROM backfill.runs WHERE batch_id = $1`, rep.BatchID).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &ids); err != nil || len(ids) != 30 {
		t.Fatalf("recorded chunk_ids %s, %v; want 30", raw, err)
	}
	fail.Store(false)
	changed := job
	changed.Chunker = IntRange(0, 30, 2)
	if _, err := r.Run(ctx, changed); !errors.Is(err, ErrPlanChanged) || !strings.Contains(err.Error(), "chunks: 30 -> 15, first difference at seq 0") {
		t.Fatalf("changed plan: %v", err)
	}
	job.Chunker = &noChunks{ChunkStreamer: IntRange(0, 30, 1).(ChunkStreamer), t: t}
	r2, err := New(db, &Config{WorkerID: "w2"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := r2.Run(ctx, job)
	if err != nil || !again.Resumed || again.BatchID != rep.BatchID || again.ChunksDone != 30 {
		t.Fatalf("resume with the streamed chunker: %+v, %v", again, err)
	}
}

// heldChunker hides its chunker's ChunkStreamer: a user Chunker.
type heldChunker struct{ c Chunker }

func (h heldChunker) Scope() string                               { return h.c.Scope() }
func (h heldChunker) Chunks(ctx context.Context) ([]Chunk, error) { return h.c.Chunks(ctx) }

// TestStreamedPlanIsRecordedWhole: a streamed plan's chunk rows are
// inserted in the transaction that creates its run: when the chunker
// fails after more chunks than one COPY or insert statement takes, no
// run and no chunk of it remain; the same plan then records whole, by
// COPY statements and by insert statements alike.
func TestStreamedPlanIsRecordedWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	pm := NewPGManifest("")
	pm.CopyBatch = 7000 // three COPY statements and a part
	if err := pm.Init(ctx, db); err != nil {
		t.Fatal(err)
	}
	n := 2*pgstore.InsertChunksBatch + 7
	ch := &noChunks{ChunkStreamer: IntRange(0, int64(n), 1).(ChunkStreamer), t: t, failAt: 2}
	job := Job{Name: "whole", Chunker: ch, Target: Target{Table: "t", Key: []string{"id"}}}
	plan, err := streamPlan(ctx, job, TableInfo{Target: job.Target}, ch) // ChunkSeq call 1
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := pm.StartRun(ctx, db, plan, "w", false); err == nil || !strings.Contains(err.Error(), "source went away") {
		t.Fatalf("start run with a failing chunker: %v", err)
	}
	count := func() (runs, chunks int) {
		err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			return tx.QueryRowxContext(ctx, `SELECT (SELECT count(*) FROM backfill.runs), (SELECT count(*) FROM backfill.chunks)`).Scan(&runs, &chunks)
		})
		if err != nil {
			t.Fatal(err)
		}
		return runs, chunks
	}
	if runs, chunks := count(); runs != 0 || chunks != 0 {
		t.Fatalf("after the failed start: %d runs, %d chunks; want none", runs, chunks)
	}
	run, _, err := pm.StartRun(ctx, db, plan, "w", false)
	if err != nil {
		t.Fatal(err)
	}
	if runs, chunks := count(); runs != 1 || chunks != n || run.ChunksTotal != n || run.ScopeLower != "0" || run.ScopeUpper != fmt.Sprint(n) {
		t.Fatalf("recorded: %d runs, %d chunks, run %+v; want 1, %d", runs, chunks, run, n)
	}
	// In a transaction that cannot prepare a COPY: insert statements of
	// insertChunksBatch chunks, the same rows.
	job.Name = "whole_unnest"
	plan, err = streamPlan(ctx, job, TableInfo{Target: job.Target}, ch)
	if err != nil {
		t.Fatal(err)
	}
	tx := db.MustBegin()
	defer tx.Rollback()
	run2, _, err := pm.StartRun(ctx, extOnly{tx}, plan, "w", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var same int
	if err := pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
		return sqlx.GetContext(ctx, tx, &same, `SELECT count(*) FROM backfill.chunks a JOIN backfill.chunks b USING (seq, chunk_id, kind, lower_bound, upper_bound, lo, hi, status)
			WHERE a.batch_id = $1 AND b.batch_id = $2`, run.BatchID, run2.BatchID)
	}); err != nil || same != n {
		t.Fatalf("chunks inserted by statements equal to those copied: %d, %v; want %d", same, err, n)
	}
}

// extOnly hides its transaction's PrepareContext.
type extOnly struct{ sqlx.ExtContext }

// TestRunSumsTheBatchPerCallNotPerChunk: the statements that sum a
// batch's chunks (the run's reject rate, its report) run as often in a
// run of 9 chunks as in one of 3 when no row is rejected, so a chunk of
// a long plan does not cost in proportion to the plan (at a million
// chunks the reject-rate sum after every chunk took 230 ms a chunk).
// With a rejected row in every chunk, the rate is summed after each.
// (The first chunk of each call sums it in both cases.)
func TestRunSumsTheBatchPerCallNotPerChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := liveDB(t)
	sdb := &stmtDB{DB: Postgres(db)}
	r, err := NewWithDB(sdb, &Config{WorkerID: "sums"})
	if err != nil {
		t.Fatal(err)
	}
	sums := func(name string, chunks int64, reject bool) (n int) {
		job := liveJob(nil)
		job.Name, job.Chunker = name, IntRange(0, 10*chunks, 10)
		if reject {
			inner := job.Extractor
			job.MaxRunRejectRate = 0.5
			job.Extractor = ExtractorFunc(func(ctx context.Context, c Chunk, w RowWriter) error {
				if err := w.Reject(ctx, "bad", "", "bad row"); err != nil {
					return err
				}
				return inner.Extract(ctx, c, w)
			})
		}
		if _, err := r.Run(ctx, job); err != nil {
			t.Fatal(err)
		}
		sdb.mu.Lock()
		defer sdb.mu.Unlock()
		for _, tx := range sdb.txs {
			for _, q := range tx.stmts {
				if strings.Contains(q, "sum(rows_") {
					n++
				}
			}
		}
		sdb.txs = nil
		return n
	}
	// A first run migrates the manifest (whose functions sum a batch too).
	sums("warm", 1, false)
	three, nine := sums("sums3", 3, false), sums("sums9", 9, false)
	if three != nine {
		t.Errorf("sums of the batch: %d in a run of 3 chunks, %d in one of 9", three, nine)
	}
	// The first chunk of a call checks the rate whatever it rejected
	// (checkRunRejectRate), so it is already one of nine's sums: the
	// other 8 chunks add one each.
	if rej := sums("sums_rejects", 9, true); rej < nine+8 {
		t.Errorf("sums of the batch with a reject in each of 9 chunks: %d, want at least %d", rej, nine+8)
	}
}

// TestDoneIDsAreBounded: a call that completes more chunks than
// maxDoneIDs counts them all (Report.ChunksRun, PartialError.DoneCount)
// and keeps the IDs of the first maxDoneIDs only.
func TestDoneIDsAreBounded(t *testing.T) {
	t.Parallel()
	ex := &execution{}
	for i := range maxDoneIDs + 10 {
		ex.addDone(fmt.Sprint("int:", i))
	}
	if ex.doneN != maxDoneIDs+10 || len(ex.done) != maxDoneIDs || ex.done[maxDoneIDs-1] != fmt.Sprint("int:", maxDoneIDs-1) {
		t.Fatalf("done: %d counted, %d IDs kept", ex.doneN, len(ex.done))
	}
	pe := &PartialError{BatchID: 1, Done: ex.done, DoneCount: ex.doneN}
	if want := fmt.Sprintf("%d chunks done in this call", maxDoneIDs+10); !strings.Contains(pe.Error(), want) {
		t.Fatalf("%v: want %q", pe, want)
	}
}

// shiftedStreamer is a ChunkStreamer whose ChunkOf breaks its contract:
// for the chunk the manifest recorded it returns the next one (another
// Seq, ID and bounds), or, with sameID, the recorded ID with shifted
// bounds.
type shiftedStreamer struct {
	ChunkStreamer
	sameID bool
}

func (s shiftedStreamer) ChunkOf(c Chunk) (Chunk, bool) {
	got, ok := s.ChunkStreamer.ChunkOf(c)
	if !ok {
		return got, ok
	}
	if !s.sameID {
		got.Seq++
		got.ID = fmt.Sprintf("int:%d/%d", got.Lo+10, got.Hi+10)
	}
	got.Lo, got.Hi = got.Lo+10, got.Hi+10
	return got, true
}

// TestRunRefusesAChunkOfAnotherChunk: a streamer's ChunkOf that returns
// another chunk than the manifest's (other Seq and ID, or the same ID
// with other bounds) fails the chunk without retrying it: nothing is
// extracted for it, no chunk is checkpointed with another's rows.
func TestRunRefusesAChunkOfAnotherChunk(t *testing.T) {
	t.Parallel()
	for _, sameID := range []bool{false, true} {
		t.Run(fmt.Sprint("same_id=", sameID), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := liveDB(t)
			r, err := New(db, &Config{WorkerID: "shifted", MaxAttempts: 3})
			require.NoError(t, err)
			job := liveJob(nil)
			job.Chunker = shiftedStreamer{ChunkStreamer: IntRange(0, 40, 10).(ChunkStreamer), sameID: sameID}
			_, err = r.Run(ctx, job)
			require.Error(t, err)
			require.ErrorContains(t, err, "is not in the plan")
			var rows, done, attempts int
			require.NoError(t, db.Get(&rows, `SELECT count(*) FROM live`))
			require.NoError(t, db.Get(&done, `SELECT count(*) FROM backfill.chunks WHERE status = 'done'`))
			require.NoError(t, db.Get(&attempts, `SELECT coalesce(max(attempts), 0) FROM backfill.chunks`))
			require.Zero(t, rows, "rows loaded for chunks the manifest did not claim")
			require.Zero(t, done, "chunks checkpointed with another chunk's rows")
			require.Equal(t, 1, attempts, "a chunk the plan cannot restore is not retried")
		})
	}
}
