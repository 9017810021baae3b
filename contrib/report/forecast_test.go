package report_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestReportForecast: the report of a run rehearsed before compares it
// with the rehearsal's forecast; a report without one shows no such
// section.
func TestReportForecast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE rehearsed (id int PRIMARY KEY, v int NOT NULL)`)
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := backfill.Job{Name: "rehearsed", Chunker: backfill.IntRange(0, 60, 10), Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "rehearsed", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for id := c.Lo; id < c.Hi; id++ {
				if err := w.Write(ctx, id, id); err != nil {
					return err
				}
			}
			return nil
		})}
	rh, err := r.Rehearse(ctx, job, backfill.RehearseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	if rr.Forecast == nil || rr.Forecast.RehearsalID != rh.ID || rr.Forecast.Rows != 60 || rr.Forecast.Forecast.Rows != 60 || !rr.Forecast.Done {
		t.Fatalf("report's forecast %+v, want rehearsal %d's, 60 rows both, done", rr.Forecast, rh.ID)
	}
	// The run recorded its WAL and its target's growth: the report shows
	// them beside the forecast.
	if f := rr.Forecast; f.WALBytes <= 0 || f.TargetBytes < 0 || f.IndexBytes < 0 {
		t.Fatalf("report's forecast: the run's WAL %d B, table +%d B, indexes +%d B: want recorded (WAL > 0, growth >= 0)", f.WALBytes, f.TargetBytes, f.IndexBytes)
	}
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rr); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	walRow := fmt.Sprintf(`<tr><td>WAL</td><td class="n">%s</td>`, report.FormatBytes(rr.Forecast.WALBytes))
	for _, w := range []string{"Against the rehearsal", "s forecast</h3>", fmt.Sprintf("Rehearsal %d of ", rh.ID), "at their mean per chunk", walRow} {
		if !strings.Contains(html, w) {
			t.Errorf("the HTML lacks %q", w)
		}
	}
	rr.Forecast = nil
	buf.Reset()
	if err := report.WriteHTML(&buf, rr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "rehearsal") {
		t.Error("a report without a rehearsal mentions one")
	}
}
