package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
)

// TestLivePlainLines: off a terminal, Live prints a plain progress line
// for the first status, none for a status within Every of the last line,
// and that withheld status as the last line from Finish (once); the line
// counts the chunks checkpointed before this call (a resume) and shows
// the manifest's rate and ETA.
func TestLivePlainLines(t *testing.T) {
	var out bytes.Buffer
	l := &Live{Out: &out, Every: time.Hour}
	ctx := context.Background()
	rate, eta := 5210.4, 72.4
	st := func(done int, read int64) backfill.Status {
		return backfill.Status{BatchID: 3, Job: "flights-3m", Status: backfill.RunRunning,
			Chunks: backfilltype.StatusChunks{Total: 182, Done: done}, Rows: backfill.Counts{Read: read},
			RecentRate: &rate, ETASeconds: &eta, Time: backfilltype.StatusTime{TotalSeconds: 40, ThrottledSeconds: 4}}
	}
	l.Progress(ctx, st(45, 740000)) // a resumed run: 45 chunks done before this call
	l.Progress(ctx, st(46, 757000)) // within Every: withheld
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := "progress flights-3m batch 3: 45/182 chunks (24.7%), 740,000 rows, 5,210 rows/s, ETA 1m12s, 40s elapsed (throttled 10%, paused 0%)"
	if len(lines) != 1 || lines[0] != want {
		t.Fatalf("lines after two statuses:\n%s\nwant only:\n%s", out.String(), want)
	}
	l.Finish()
	l.Finish()
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], " 46/182 chunks ") || !strings.Contains(lines[1], "757,000 rows") {
		t.Fatalf("after Finish:\n%s\nwant the withheld status as a second line", out.String())
	}

	// Unknown rate and ETA, and a run that is no longer running.
	s := backfill.Status{BatchID: 4, Job: "j", Status: backfill.RunPaused, Chunks: backfilltype.StatusChunks{Total: 2}}
	if got := StatusLine(s); !strings.Contains(got, "- rows/s, ETA unknown") || !strings.HasSuffix(got, ", run paused") {
		t.Errorf("StatusLine of a paused run without rates: %q", got)
	}
}

// TestLiveFinishAfterPrintedLine: Finish prints nothing when the last
// status was already printed.
func TestLiveFinishAfterPrintedLine(t *testing.T) {
	var out bytes.Buffer
	l := &Live{Out: &out, Every: time.Nanosecond}
	l.Progress(context.Background(), backfill.Status{Job: "j", Chunks: backfilltype.StatusChunks{Total: 1, Done: 1}})
	l.Finish()
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Errorf("%d lines, want 1:\n%s", n, out.String())
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 3000000: "3,000,000", -12345: "-12,345"} {
		if got := Thousands(n); got != want {
			t.Errorf("Thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
