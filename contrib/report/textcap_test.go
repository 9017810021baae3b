package report_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestHTMLCapsLongTexts: a run whose manifest holds a 50 MiB pause reason
// (the run's last error and its audit event) and a 50 MiB exception value
// gives an HTML report under 2 MB that shows the head of each text and its
// full length; the JSON twin keeps the texts whole.
func TestHTMLCapsLongTexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlx.MustOpen("postgres", pgtest.NewURL(t))
	t.Cleanup(func() { db.Close() })
	db.MustExec(`CREATE TABLE capped (id int PRIMARY KEY, v int NOT NULL)`)
	r, err := backfill.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(ctx, backfill.Job{Name: "capped", Chunker: backfill.List("all"), MaxRunRejectRate: -1, Rollback: backfill.RollbackNone,
		Target: backfill.Target{Table: "capped", Key: []string{"id"}},
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if err := w.Write(ctx, 1, 10); err != nil {
				return err
			}
			return w.Write(ctx, 2, "not a number")
		})})
	if err != nil {
		t.Fatal(err)
	}
	const size = 50 << 20 // characters
	db.MustExec(`UPDATE backfill.runs SET last_error = 'paused: ' || repeat('R', $2) WHERE batch_id = $1`, rep.BatchID, size-8)
	db.MustExec(`INSERT INTO backfill.events (batch_id, job_name, kind, actor, detail)
		VALUES ($1, 'capped', 'run_note', repeat('A', $2), jsonb_build_object('why', repeat('W', $2)))`, rep.BatchID, size)
	db.MustExec(`UPDATE backfill.exceptions SET value = repeat('V', $2) WHERE batch_id = $1`, rep.BatchID, size)

	full, err := backfill.LoadRunReport(ctx, db, backfill.NewPGManifest(""), rep.BatchID)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, full); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	t.Logf("HTML with four 50 MiB texts: %d bytes", len(html))
	if len(html) > 2<<20 {
		t.Errorf("HTML: %d bytes, want under 2 MB", len(html))
	}
	// The reason, the actor, the value and the event's detail (its JSON
	// text, {"why": "...", 11 characters more than the why) each show
	// their length.
	for _, want := range []string{
		"RRRRRRRR … (52,428,800 characters; the full text is in the report&#39;s JSON twin)",
		"AAAAAAAA … (52,428,800 characters;",
		"VVVVVVVV … (52,428,800 characters;",
		"WWWWWWWW … (52,428,811 characters;",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the HTML does not show %q", want)
		}
	}
	var js bytes.Buffer
	if err := report.WriteJSON(&js, full); err != nil {
		t.Fatal(err)
	}
	if js.Len() < 3*size {
		t.Errorf("JSON twin: %d bytes, want the texts whole (over %d)", js.Len(), 3*size)
	}
}
