package report_test

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/contrib/report"
)

// A report rendered as one HTML file. Here the report is built by hand;
// in use it comes from backfill.LoadRunReport (a database and a batch
// ID), and the file is written with os.Create.
func ExampleWriteHTML() {
	t0 := time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { t := t0.Add(time.Duration(s) * time.Second); return &t }
	rep := backfill.RunReport{
		GeneratedAt: t0.Add(time.Hour),
		Schema:      "backfill",
		Plan: backfilltype.ReportPlan{BatchID: 7, Job: "orders-2025", CodeVersion: "a1b2c3", Fingerprint: "9f86d081",
			Scope: "days [2025-01-01, 2025-01-03) UTC", ChunksTotal: 2, Status: backfill.RunCompleted,
			Rollback: backfill.RollbackUndoLog, StartedBy: "alice", CreatedAt: t0, FinishedAt: at(90)},
		Totals: backfilltype.ReportTotals{ChunksByStatus: map[string]int{"done": 2}, Attempts: 2, Workers: 2, TimedChunks: 2, BusySeconds: 125,
			Rows: backfill.Counts{Read: 2700, Inserted: 2690, Rejected: 10}},
		Buckets: backfilltype.ReportBuckets{ChunksPerBucket: 1, Buckets: []backfilltype.ReportBucket{
			{FirstSeq: 0, LastSeq: 0, Chunks: 1, ChunksByStatus: map[string]int{"done": 1}, Attempts: 1,
				Rows: backfill.Counts{Read: 1200, Inserted: 1190, Rejected: 10}, TimedChunks: 1, BusySeconds: 39, MeanSeconds: 39, RowsPerSecond: 1200.0 / 39},
			{FirstSeq: 1, LastSeq: 1, Chunks: 1, ChunksByStatus: map[string]int{"done": 1}, Attempts: 1,
				Rows: backfill.Counts{Read: 1500, Inserted: 1500}, TimedChunks: 1, BusySeconds: 86, MeanSeconds: 86, RowsPerSecond: 1500.0 / 86},
		}},
		Notable: []backfilltype.ReportChunk{
			{Seq: 0, ID: "day:2025-01-01", Status: "done", Worker: "host-a:41", StartedAt: at(1), FinishedAt: at(40), DurationSeconds: 39,
				Counts: backfill.Counts{Read: 1200, Inserted: 1190, Rejected: 10}, Notable: []string{"slowest", "most_rejects"}},
			{Seq: 1, ID: "day:2025-01-02", Status: "done", Worker: "host-b:17", StartedAt: at(2), FinishedAt: at(88), DurationSeconds: 86,
				Counts: backfill.Counts{Read: 1500, Inserted: 1500}, Notable: []string{"slowest"}},
		},
		ChunkWorkers: []backfilltype.ReportChunkWorker{
			{Worker: "host-b:17", Chunks: 1, Rows: backfill.Counts{Read: 1500, Inserted: 1500}, BusySeconds: 86},
			{Worker: "host-a:41", Chunks: 1, Rows: backfill.Counts{Read: 1200, Inserted: 1190, Rejected: 10}, BusySeconds: 39},
		},
		Durations: backfilltype.ReportDurations{Count: 2, Min: 39, Mean: 62.5, P50: 39, P90: 86, P99: 86, Max: 86,
			Bins: []backfilltype.ReportBin{{From: 36.2, To: 43.05, Count: 1}, {From: 81.9, To: 97.4, Count: 1}}},
	}
	var buf bytes.Buffer
	if err := report.WriteHTML(&buf, rep); err != nil {
		fmt.Println(err)
		return
	}
	html := buf.String()
	fmt.Println("charts:", strings.Count(html, `<svg class="chart `))
	fmt.Println("scripts:", strings.Count(html, "<script"))
	fmt.Println("shows the job:", strings.Contains(html, "orders-2025"))
	// Output:
	// charts: 4
	// scripts: 0
	// shows the job: true
}
