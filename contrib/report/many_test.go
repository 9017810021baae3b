package report_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
)

// TestHTMLOfManyChunks: a run of 10,000 chunks on 8 workers renders, every
// chunk a mark of the timeline, in a file that stays small enough to mail
// (under 8 MB).
func TestHTMLOfManyChunks(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	rep := backfill.RunReport{Plan: backfilltype.ReportPlan{Job: "many", CreatedAt: t0, ChunksTotal: 10_000, Status: backfill.RunCompleted}}
	for i := range 10_000 {
		start, end := t0.Add(time.Duration(i/8)*3*time.Second), t0.Add(time.Duration(i/8)*3*time.Second+time.Duration(1000+i%2000)*time.Millisecond)
		rep.Chunks = append(rep.Chunks, backfilltype.ReportChunk{Seq: i, ID: fmt.Sprint("int:", i), Status: "done", Worker: fmt.Sprint("w", i%8),
			StartedAt: &start, FinishedAt: &end, DurationSeconds: end.Sub(start).Seconds(), Counts: backfill.Counts{Read: 1000, Inserted: 1000}})
	}
	rep.Time.End = t0.Add(3750 * time.Second)
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rep); err != nil {
		t.Fatal(err)
	}
	tl := buf.String()
	tl = tl[strings.Index(tl, `<svg class="chart timeline"`):]
	tl = tl[:strings.Index(tl, "</svg>")]
	if n := strings.Count(tl, "<path"); n < 10_000 {
		t.Errorf("timeline: %d marks, want one per chunk (10000)", n)
	}
	if buf.Len() > 8<<20 {
		t.Errorf("HTML of 10000 chunks: %d bytes, want under 8 MB", buf.Len())
	}
	t.Logf("HTML of 10000 chunks: %d bytes", buf.Len())
}
