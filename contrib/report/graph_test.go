package report_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/contrib/report"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestGraphReportShowsModules: the report of a graph's run shows each
// module's progress and state (a disabled one, its dependent held by
// it), in the HTML and in the JSON twin.
func TestGraphReportShowsModules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	job := func(table string) backfill.Job {
		db.MustExec(fmt.Sprintf(`CREATE TABLE %q (id bigint PRIMARY KEY, v text)`, table))
		return backfill.Job{Name: table, Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
			Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
				for id := c.Lo; id < c.Hi; id++ {
					if err := w.Write(ctx, id, "x"); err != nil {
						return err
					}
				}
				return nil
			}),
			Target: backfill.Target{Table: table, Key: []string{"id"}, Columns: []string{"id", "v"}}}
	}
	g := backfill.Graph{Name: "routes", Modules: []backfill.Module{
		{Name: "airports", Jobs: []backfill.Job{job("airports")}},
		{Name: "stats", Jobs: []backfill.Job{job("stats")}, DependsOn: []string{"airports"}, Disabled: true},
		{Name: "daily", Jobs: []backfill.Job{job("daily")}, DependsOn: []string{"stats"}},
	}}
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := r.RunGraph(ctx, g)
	if rep.BatchID == 0 {
		t.Fatal("no graph run")
	}
	rr, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Graph == nil || len(rr.Graph.Modules) != 3 {
		t.Fatalf("graph status in the report: %+v", rr.Graph)
	}
	if m := rr.Graph.Modules[2]; m.State != backfilltype.ModuleHeld || m.HeldBy != "stats" {
		t.Fatalf("daily: %+v, want held by stats", m)
	}
	if m := rr.Graph.Modules[0]; m.State != backfilltype.ModuleCompleted || m.ChunksDone != 3 || m.Rows != 30 {
		t.Fatalf("airports: %+v, want completed, 3 chunks, 30 rows", m)
	}
	var html, js bytes.Buffer
	if err := report.WriteHTML(&html, rr); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteJSON(&js, rr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<h2 id="modules">Modules</h2>`, `<td>airports</td><td><span class="status completed">completed</span>`,
		`<span class="status disabled">disabled</span>`, `<span class="status held">held</span> by stats`, `3 / 3`} {
		if !bytes.Contains(html.Bytes(), []byte(want)) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if !bytes.Contains(js.Bytes(), []byte(`"held_by": "stats"`)) {
		t.Errorf("JSON lacks the held module: %s", js.String())
	}
}

// TestGraphReportAwaitingApproval: the report of a graph awaiting
// approval shows its approvals with the command that records one, and
// each module's chunks from its plan (no job has a run yet).
func TestGraphReportAwaitingApproval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE hubs (id bigint PRIMARY KEY, v text)`)
	job := backfill.Job{Name: "hubs", Chunker: backfill.IntRange(0, 30, 10), Rollback: backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error { return nil }),
		Target:    backfill.Target{Table: "hubs", Key: []string{"id"}, Columns: []string{"id", "v"}}}
	g := backfill.Graph{Name: "hubs_graph", Approval: backfill.ApprovalPolicy{Approvers: 2}, Modules: []backfill.Module{{Name: "hubs", Jobs: []backfill.Job{job}}}}
	r, err := backfill.New(db, &backfill.Config{ReturnOnPause: true})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunGraph(ctx, g)
	if !errors.Is(err, backfill.ErrAwaitingApproval) {
		t.Fatalf("RunGraph: %v, want awaiting approval", err)
	}
	rr, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	var html bytes.Buffer
	if err := report.WriteHTML(&html, rr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Approvals: 0 of 2 of plan fingerprint <code>" + rep.Fingerprint + "</code>",
		fmt.Sprintf("backfill approve --batch %d --fingerprint %s", rep.BatchID, rep.Fingerprint), "0 / 3"} {
		if !bytes.Contains(html.Bytes(), []byte(want)) {
			t.Errorf("HTML lacks %q", want)
		}
	}
}
