package backfill_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltest"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestTypoColumnNamesTheColumnAndSuggests: every column name a Target
// gives that the table lacks is refused with ErrTargetNotFound naming the
// column and its role, listing the table's columns and suggesting the
// closest one.
func TestTypoColumnNamesTheColumnAndSuggests(t *testing.T) {
	t.Parallel()
	key := [][]string{{"id"}}
	for _, c := range []struct {
		name    string
		target  backfill.Target
		msg     string
		closest string
	}{
		{"written", backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "nmae"}}, `written column "nmae"`, "name"},
		{"key", backfill.Target{Table: "t", Key: []string{"idd"}}, `key column "idd"`, "id"},
		{"hash", backfill.Target{Table: "t", Key: []string{"id"}, HashColumn: "row_hsah"}, `hash column "row_hsah"`, "row_hash"},
		{"ingested", backfill.Target{Table: "t", Key: []string{"id"}, IngestedAt: "laoded_at"}, `ingested_at column "laoded_at"`, "loaded_at"},
		{"lineage", backfill.Target{Table: "t", Key: []string{"id"}, Lineage: backfill.Lineage{InsertedBy: "backfill_insertd_by"}}, `lineage inserted_by column "backfill_insertd_by"`, "backfill_inserted_by"},
		{"valid_from", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidFrom: "valid_frm"}, `valid_from column "valid_frm"`, "valid_from"},
		{"valid_to", backfill.Target{Table: "t", Key: []string{"id"}, Mode: backfill.History, ValidTo: "valid_t"}, `valid_to column "valid_t"`, "valid_to"},
		{"version", backfill.Target{Table: "t", Key: []string{"id"}, Conflict: backfill.NewerVersionWins, Version: "verison"}, `version column "verison"`, "version"},
		{"derive source", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name"}, Derive: []backfill.KeyRule{{Column: "name_key", From: "nam"}}},
			`Derive source column "nam"`, "name"},
		{"derive key", backfill.Target{Table: "t", Key: []string{"name_key"}, Mode: backfill.Keyless, Columns: []string{"name"}, Derive: []backfill.KeyRule{{Column: "name_kye", From: "name"}}},
			`Derive rule's key column "name_kye"`, "name_key"},
	} {
		_, err := pgstore.ResolveTarget(c.target, targetTable(), key)
		require.ErrorIs(t, err, backfill.ErrTargetNotFound, c.name)
		require.ErrorContains(t, err, c.msg, c.name)
		require.ErrorContains(t, err, `"id", "name", "name_key", "version"`, c.name)
		require.ErrorContains(t, err, `did you mean "`+c.closest+`"?`, c.name)
	}
}

// TestTypoTableNamesTheSearchPath: a table name that names no table is
// refused with ErrTargetNotFound naming it, the session's search_path and
// its schemas, and the closest table there; a qualified one names its
// schema.
func TestTypoTableNamesTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE events (id bigint PRIMARY KEY, v text)`)
	db.MustExec(`CREATE SCHEMA other; CREATE TABLE other.orders (id bigint PRIMARY KEY)`)
	m := pgstore.NewMerger()
	_, err := m.Prepare(ctx, db, backfill.Target{Table: "evnets", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `table "evnets"`)
	require.ErrorContains(t, err, `search_path ("$user", public: schemas public)`)
	require.ErrorContains(t, err, `did you mean "events"?`)

	_, err = m.Prepare(ctx, db, backfill.Target{Table: "other.ordres", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `no such table in schema "other"`)
	require.ErrorContains(t, err, `did you mean "other.orders"?`)

	// A column typo against the real table lists its columns.
	_, err = m.Prepare(ctx, db, backfill.Target{Table: "events", Key: []string{"id"}, Columns: []string{"id", "vv"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `written column "vv" of table "public.events"`)
	require.ErrorContains(t, err, `"id", "v"; did you mean "v"?`)
}

// TestTypoOnTheFakes: the fake merger names a missing table with the
// tables it has, and a missing column with the table's columns.
func TestTypoOnTheFakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := backfilltest.NewMerger()
	m.AddTable("events", []string{"id"}, "id", "v")
	_, err := m.Prepare(ctx, nil, backfill.Target{Table: "evnets", Key: []string{"id"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `its tables are "events"; did you mean "events"?`)
	_, err = m.Prepare(ctx, nil, backfill.Target{Table: "events", Key: []string{"id"}, Columns: []string{"id", "vv"}})
	require.ErrorIs(t, err, backfill.ErrTargetNotFound)
	require.ErrorContains(t, err, `written column "vv"`)
	require.ErrorContains(t, err, `"id", "v"; did you mean "v"?`)
}

// TestManifestInitHintsSSLMode: a server without SSL, asked for it (lib/pq's
// default sslmode is require), is told to be asked with sslmode=disable.
func TestManifestInitHintsSSLMode(t *testing.T) {
	t.Parallel()
	u := pgtest.NewURL(t)
	ssl := strings.Replace(u, "sslmode=disable", "sslmode=require", 1)
	require.NotEqual(t, u, ssl, "the test server's URL names sslmode=disable")
	db := sqlx.MustOpen("postgres", ssl)
	defer db.Close()
	err := backfill.NewPGManifest("backfill").Init(context.Background(), db)
	require.ErrorContains(t, err, "manifest init: pq: SSL is not enabled on the server")
	require.ErrorContains(t, err, "add sslmode=disable")
}

// TestRunRejectGateOnTheLastChunkSaysWhatToDo: when the run reject gate
// pauses the run after its last chunk, the error does not say the batch
// partially completed; it names Job.MaxRunRejectRate, the rate and the
// limit, and what to do (the exceptions command, resume, raise the limit,
// roll back). So does the "no row loaded" gate.
func TestRunRejectGateOnTheLastChunkSaysWhatToDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newItems(t)
	job := s.job(1)
	job.Chunker = backfill.IntRange(0, 20, 10)
	job.MaxRunRejectRate = 0.05
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		for id := c.Lo; id < c.Hi; id++ {
			var err error
			if c.Lo == 10 && id%2 == 0 {
				err = w.Reject(ctx, map[string]any{"id": id}, "", "bad row")
			} else {
				err = w.Write(ctx, "acme", id, "x", "1.00", nil)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	r, err := backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err := r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
	require.Equal(t, 2, rep.ChunksDone, "every chunk is done")
	msg := err.Error()
	require.NotContains(t, msg, "partially completed")
	for _, want := range []string{"run reject rate 5/20 = 0.2500 exceeds Job.MaxRunRejectRate 0.0500",
		fmt.Sprintf("backfill exceptions --batch %d", rep.BatchID), "backfill resume --job " + job.Name, "raise Job.MaxRunRejectRate",
		fmt.Sprintf("backfill rollback --batch %d", rep.BatchID)} {
		require.Contains(t, msg, want)
	}

	// Every row rejected, with the rate gate off: the "no row loaded"
	// gate says what to do too.
	s = newItems(t)
	job = s.job(1)
	job.Chunker = backfill.IntRange(0, 10, 10)
	job.MaxRunRejectRate = -1
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		return w.Reject(ctx, map[string]any{"id": 1}, "", "bad row")
	})
	r, err = backfill.New(s.db, &backfill.Config{ReturnOnPause: true})
	require.NoError(t, err)
	rep, err = r.Run(ctx, job)
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.NotContains(t, err.Error(), "partially completed")
	require.Contains(t, err.Error(), fmt.Sprintf("backfill exceptions --batch %d", rep.BatchID))
}

// TestBuiltInChecksOnTheFakesRefusedBeforeTheRun: every built-in check
// that reads the staging table with SQL is refused, with the fakes,
// before any batch is created, naming the check and what to use instead;
// CheckExceptionRate and a ValidatorFunc run on the fakes.
func TestBuiltInChecksOnTheFakesRefusedBeforeTheRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		v    backfill.Validator
		name string
	}{
		{backfill.DuplicateKeys{}, "duplicate_keys"},
		{backfill.Completeness{}, "completeness"},
		{backfill.ReferentialIntegrity{Columns: []string{"v"}, ParentTable: "p"}, "referential_integrity"},
		{backfill.Aggregates{}, "aggregates"},
		{backfill.ReplayChangesNothing{}, "replay_changes_nothing"},
		{backfill.Sample{Name: "mine"}, "mine"},
	} {
		m, man := backfilltest.NewMerger(), backfilltest.NewManifest()
		m.AddTable("t", []string{"id"}, "id", "v")
		r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m})
		require.NoError(t, err)
		extracted := false
		job := backfill.Job{Name: "fakes", Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone,
			Target: backfill.Target{Table: "t", Key: []string{"id"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				extracted = true
				return w.Write(ctx, ch.Lo, "x")
			}),
			Validators: []backfill.Validator{backfill.CheckExceptionRate{}, c.v}}
		_, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrUnsupported, c.name)
		require.ErrorContains(t, err, "built-in check "+c.name, c.name)
		require.ErrorContains(t, err, "PostgreSQL merger", c.name)
		require.False(t, extracted, "refused before any chunk")
		_, err = man.LatestRun(ctx, nil, "fakes")
		require.Error(t, err, "no batch was created")
	}

	m, man := backfilltest.NewMerger(), backfilltest.NewManifest()
	m.AddTable("t", []string{"id"}, "id", "v")
	r, err := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{Manifest: man, Merger: m})
	require.NoError(t, err)
	job := backfill.Job{Name: "fakes", Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "t", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
			return w.Write(ctx, ch.Lo, "x")
		}),
		Validators: []backfill.Validator{backfill.CheckExceptionRate{}, backfill.ValidatorFunc(
			func(ctx context.Context, tx sqlx.ExtContext, s backfill.ValidationScope) (backfill.CheckResult, error) {
				return backfill.CheckResult{Check: "mine", Passed: s.Counts.Read == 1}, nil
			})}}
	rep, err := r.Run(ctx, job)
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
}

// TestCheckAndChunkColumnTyposSuggest: a name a check or Job.ChunkColumn
// gives that names nothing is refused naming it, listing what exists and
// suggesting the closest, without an SQL error.
func TestCheckAndChunkColumnTyposSuggest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE parent (id bigint PRIMARY KEY); INSERT INTO parent VALUES (1)`)
	db.MustExec(`CREATE TABLE child (id bigint PRIMARY KEY, name text, ref bigint)`)
	for i, c := range []struct {
		v     backfill.Validator
		chunk string
		want  []string
	}{
		{v: backfill.DuplicateKeys{Columns: []string{"nmae"}}, want: []string{`DuplicateKeys.Columns: column "nmae" of table "public.child"`, `did you mean "name"?`}},
		{v: backfill.ReferentialIntegrity{Columns: []string{"reff"}, ParentTable: "parent", ParentColumns: []string{"id"}},
			want: []string{`ReferentialIntegrity.Columns: column "reff"`, `did you mean "ref"?`}},
		{v: backfill.ReferentialIntegrity{Columns: []string{"ref"}, ParentTable: "parnet", ParentColumns: []string{"id"}},
			want: []string{`table "parnet": no such table in the session's search_path`, `did you mean "parent"?`}},
		{v: backfill.ReferentialIntegrity{Columns: []string{"ref"}, ParentTable: "parent", ParentColumns: []string{"idd"}},
			want: []string{`column "idd" of table "parent"`, `did you mean "id"?`}},
		{v: backfill.Aggregates{Dimensions: []string{"nmae"}}, want: []string{`column "nmae" is not a staged column`, `did you mean "name"?`}},
		{chunk: "idd", want: []string{`ChunkColumn "idd" is not a written column`, `did you mean "id"?`}},
	} {
		r, err := backfill.New(db, &backfill.Config{MaxAttempts: 1})
		require.NoError(t, err)
		job := backfill.Job{Name: fmt.Sprint("typo-", i), Chunker: backfill.IntRange(0, 2, 1), Rollback: backfill.RollbackNone, ChunkColumn: c.chunk,
			Target: backfill.Target{Table: "child", Key: []string{"id"}, Columns: []string{"id", "name", "ref"}},
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, ch backfill.Chunk, w backfill.RowWriter) error {
				return w.Write(ctx, ch.Lo, "x", 1)
			})}
		if c.v != nil {
			job.Validators = []backfill.Validator{c.v}
		}
		_, err = r.Run(ctx, job)
		require.ErrorIs(t, err, backfill.ErrInvalidConfig, "%d", i)
		for _, w := range c.want {
			require.ErrorContains(t, err, w, "%d", i)
		}
		require.NotContains(t, err.Error(), "SQLSTATE", "%d", i)
		require.NotContains(t, err.Error(), "pq:", "%d", i)
	}
}
