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

// TestHTMLOfManyChunks: a run of 1,000,000 chunks on 8 workers, as
// LoadRunReport gives it (512 buckets of 2,048 chunks, a bounded list of
// notable chunks), renders every bucket as a mark of the chunks chart in
// a small file.
func TestHTMLOfManyChunks(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	const n, per = 1_000_000, 2048
	rep := backfill.RunReport{Plan: backfilltype.ReportPlan{Job: "many", CreatedAt: t0, ChunksTotal: n, Status: backfill.RunRunning},
		Totals:  backfilltype.ReportTotals{ChunksByStatus: map[string]int{"done": n - 1000, "failed": 1000}},
		Buckets: backfilltype.ReportBuckets{ChunksPerBucket: per}}
	for first := 0; first < n; first += per {
		last := min(first+per, n) - 1
		k := last - first + 1
		rep.Buckets.Buckets = append(rep.Buckets.Buckets, backfilltype.ReportBucket{FirstSeq: first, LastSeq: last, Chunks: k,
			ChunksByStatus: map[string]int{"done": k - 2, "failed": 2}, Rows: backfill.Counts{Read: int64(k) * 1000, Inserted: int64(k) * 1000},
			TimedChunks: k, BusySeconds: float64(k) * 1.5, MeanSeconds: 1.5, RowsPerSecond: 1000 / 1.5})
	}
	for i := range 8 {
		rep.ChunkWorkers = append(rep.ChunkWorkers, backfilltype.ReportChunkWorker{Worker: fmt.Sprint("w", i), Chunks: n / 8})
	}
	for i := range backfilltype.ReportNotableFailed {
		rep.Notable = append(rep.Notable, backfilltype.ReportChunk{Seq: i * 1000, ID: fmt.Sprint("int:", i*1000), Status: "failed", LastError: "boom",
			Notable: []string{"failed"}})
	}
	rep.Time.End = t0.Add(3750 * time.Second)
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rep); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	ch := html[strings.Index(html, `<svg class="chart chunks"`):]
	ch = ch[:strings.Index(ch, "</svg>")]
	if got := strings.Count(ch, "<path"); got < len(rep.Buckets.Buckets) {
		t.Errorf("chunks chart: %d marks, want one per bucket at least (%d)", got, len(rep.Buckets.Buckets))
	}
	if !strings.Contains(html, "more not done") {
		t.Error("the chunks not done beyond those listed are not counted")
	}
	if buf.Len() > 2<<20 {
		t.Errorf("HTML of 1,000,000 chunks: %d bytes, want under 2 MB", buf.Len())
	}
	t.Logf("HTML of 1,000,000 chunks: %d bytes", buf.Len())
}
