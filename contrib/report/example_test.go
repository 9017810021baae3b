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
		Chunks: []backfilltype.ReportChunk{
			{Seq: 0, ID: "day:2025-01-01", Status: "done", Worker: "host-a:41", StartedAt: at(1), FinishedAt: at(40), DurationSeconds: 39,
				Counts: backfill.Counts{Read: 1200, Inserted: 1190, Rejected: 10}},
			{Seq: 1, ID: "day:2025-01-02", Status: "done", Worker: "host-b:17", StartedAt: at(2), FinishedAt: at(88), DurationSeconds: 86,
				Counts: backfill.Counts{Read: 1500, Inserted: 1500}},
		},
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
