package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/pgbackfill/backfill"
)

// Live is a [backfill.ProgressHooks] that shows a run's progress as the
// manifest records it ([backfill.Status]): the chunks checkpointed out of
// the plan, the rows, the recent working rate and the ETA. Since every
// status is read from the manifest, the display starts where the run
// stands, after a resume too, and counts the work of other processes.
//
// On a terminal it draws a progress bar (github.com/schollz/progressbar);
// elsewhere (CI, a log file, tests) it prints a plain line at most every
// Every, and the last one from [Live.Finish]. Chunks, if set, counts
// this call's chunks (for the summary) and prints its per-chunk lines
// when its Format is set.
type Live struct {
	Chunks *Progress
	// Out receives the bar or the lines; usually os.Stderr.
	Out io.Writer
	// Terminal draws a bar instead of lines ([IsTerminal]).
	Terminal bool
	// Every is the least time between two plain lines; 0: 10 s.
	Every time.Duration
	// OnStatus, when set, is called with every status shown, before it
	// is shown (measurements of the ETA).
	OnStatus func(backfill.Status)

	mu       sync.Mutex
	bar      *progressbar.ProgressBar
	last     backfill.Status
	seen     bool
	printed  time.Time
	unshown  bool // last was not printed as a line
	finished bool
}

var _ backfill.ProgressHooks = (*Live)(nil)

// ChunkDone implements [backfill.Hooks]: it passes r to Chunks.
func (l *Live) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	if l.Chunks != nil {
		l.Chunks.ChunkDone(ctx, batchID, r)
	}
}

// IsTerminal reports whether f is a terminal (a bar can be redrawn on it).
func IsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// ChunkFailed implements [backfill.ProgressHooks]: one line per failed
// attempt.
func (l *Live) ChunkFailed(ctx context.Context, batchID int64, f backfill.ChunkFailure) {
	l.mu.Lock()
	defer l.mu.Unlock()
	what := "will be retried"
	if f.Final {
		what = "failed for good"
	}
	if l.bar != nil {
		_ = l.bar.Clear()
	}
	fmt.Fprintf(l.Out, "batch %d chunk %s attempt %d %s: %v\n", batchID, f.Chunk.ID, f.Attempt, what, f.Err)
	if l.bar != nil {
		_ = l.bar.RenderBlank()
	}
}

// Progress implements [backfill.ProgressHooks].
func (l *Live) Progress(ctx context.Context, s backfill.Status) {
	if l.OnStatus != nil {
		l.OnStatus(s)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last, l.seen = s, true
	done := s.Chunks.Done + s.Chunks.Open
	if l.Terminal {
		if l.bar == nil {
			l.bar = progressbar.NewOptions(max(s.Chunks.Total, 1),
				progressbar.OptionSetWriter(l.Out),
				progressbar.OptionSetDescription(fmt.Sprintf("%s batch %d", s.Job, s.BatchID)),
				progressbar.OptionShowCount(),
				progressbar.OptionSetItsString("chunks"),
				progressbar.OptionSetPredictTime(false),
				progressbar.OptionSetElapsedTime(false),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(0),
				progressbar.OptionShowDescriptionAtLineEnd(),
			)
		}
		// Describe renders with the old count, Set with the new one: the
		// last render shows both of this status.
		l.bar.Describe(fmt.Sprintf("chunks  %s", statusDetail(s)))
		_ = l.bar.Set(done)
		return
	}
	every := l.Every
	if every <= 0 {
		every = 10 * time.Second
	}
	if !l.printed.IsZero() && time.Since(l.printed) < every {
		l.unshown = true
		return
	}
	l.printLine(s)
}

// printLine prints s as one plain line.
func (l *Live) printLine(s backfill.Status) {
	fmt.Fprintf(l.Out, "progress %s\n", StatusLine(s))
	l.printed, l.unshown = time.Now(), false
}

// Finish ends the display after the call of Run: the bar's last state
// and a newline, or the last status as a line if it was not printed yet.
// It is safe to call more than once.
func (l *Live) Finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return
	}
	l.finished = true
	switch {
	case l.bar != nil:
		_ = l.bar.Exit()
		fmt.Fprintln(l.Out)
	case l.seen && l.unshown:
		l.printLine(l.last)
	}
}

// StatusLine formats s on one line, e.g.
//
//	flights-3m batch 3: 45/182 chunks (24.7%), 740,000 rows, 5,210 rows/s, ETA 1m12s, 40s elapsed (throttled 12%)
func StatusLine(s backfill.Status) string {
	done := s.Chunks.Done + s.Chunks.Open
	pct := 0.0
	if s.Chunks.Total > 0 {
		pct = 100 * float64(done) / float64(s.Chunks.Total)
	}
	return fmt.Sprintf("%s batch %d: %d/%d chunks (%.1f%%), %s", s.Job, s.BatchID, done, s.Chunks.Total, pct, statusDetail(s))
}

// statusDetail formats the rows, rate, ETA and time of s.
func statusDetail(s backfill.Status) string {
	rate := "- rows/s"
	if r := s.RecentRate; r != nil {
		rate = Thousands(int64(*r)) + " rows/s"
	} else if r := s.OverallRate; r != nil {
		rate = Thousands(int64(*r)) + " rows/s"
	}
	eta := "ETA unknown"
	if d, ok := s.ETA(); ok {
		eta = "ETA " + d.Round(time.Second).String()
	}
	line := fmt.Sprintf("%s rows, %s, %s, %s elapsed", Thousands(s.Rows.Read), rate, eta,
		time.Duration(s.Time.TotalSeconds*float64(time.Second)).Round(time.Second))
	if t := s.Time; t.TotalSeconds > 0 && (t.ThrottledSeconds > 0 || t.PausedSeconds > 0) {
		line += fmt.Sprintf(" (throttled %.0f%%, paused %.0f%%)", 100*t.ThrottledSeconds/t.TotalSeconds, 100*t.PausedSeconds/t.TotalSeconds)
	}
	if s.Status != backfill.RunRunning {
		line += ", run " + string(s.Status)
	}
	return line
}

// Thousands formats n with commas between groups of three digits.
func Thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
