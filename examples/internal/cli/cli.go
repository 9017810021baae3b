// Package cli holds the helpers that the example commands (flights,
// earthquakes) share: locating the data directory, explaining a failed
// job, printing one line per chunk and a summary read from the manifest,
// and reading the process's peak memory. What differs between the
// commands is passed in; everything a single command needs stays in it.
package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgurl"
	"github.com/pgbackfill/backfill/internal/quote"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// Exit statuses of the example commands, as the operator's command
// (cmd/backfill) uses them: 1 a failure, 2 a usage error (a bad flag or
// argument, DATABASE_URL unset or not a PostgreSQL URL).
const (
	ExitError = 1
	ExitUsage = 2
)

// ExitDoc documents the exit statuses, for a command's -h.
const ExitDoc = "Exit status: 0 done, 1 the load failed (the message says why and what to do), 2 a usage error: a bad flag or argument, DATABASE_URL unset or not a postgres:// URL.\n"

// usageError is an error in how a command was called.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// Usage marks err as a usage error: [ExitCode] maps it to [ExitUsage].
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// ExitCode returns the exit status of a command that failed with err:
// [ExitUsage] for a usage error ([Usage]), else [ExitError].
func ExitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return ExitUsage
	}
	return ExitError
}

// SetUsage makes flag's -h print the command's flags and then [ExitDoc].
func SetUsage(fs *flag.FlagSet) {
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		fmt.Fprint(out, "\n"+ExitDoc)
	}
}

// RunError wraps err, the error of running job, with the job's name and,
// for the errors a user can act on, a hint: for [backfill.ErrPlanChanged]
// that the plan differs, naming planFlag (e.g. "-limit-days") as a likely
// cause; for a [backfill.PartialError] that rerunning resumes the run. It
// returns nil if err is nil.
func RunError(job, planFlag string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, backfill.ErrPlanChanged) {
		return fmt.Errorf("job %s: %w\n(the job's existing run has a different plan, e.g. another %s or code version: rerun with the old flags, or pass -new-run to start a new run)", job, err, planFlag)
	}
	if errors.Is(err, backfill.ErrAlreadyCompleted) {
		return fmt.Errorf("job %s: %w\n(the job's run with this plan is already complete and nothing was done: pass -new-run to load it again as a new run)", job, err)
	}
	if errors.Is(err, backfill.ErrChunksOpen) && !errors.Is(err, backfill.ErrGateFailed) {
		var pe *backfill.PartialError
		if !errors.As(err, &pe) {
			return fmt.Errorf("job %s: %w\n(the scope reaches past the source's horizon: its last chunks were loaded but stay open; run the same command again later to close them)", job, err)
		}
	}
	if errors.Is(err, backfill.ErrRunPaused) {
		return fmt.Errorf("job %s: %w\n(paused: the chunks in flight finished. To resume: %s; then run the same command again)", job, err, resumeCommands(job))
	}
	if errors.Is(err, backfill.ErrRunCancelled) {
		return fmt.Errorf("job %s: %w\n(cancelled: the chunks in flight rolled back. To restart it: %s; then run the same command again; or pass -new-run)", job, err, resumeCommands(job))
	}
	var pe *backfill.PartialError
	if errors.As(err, &pe) {
		return fmt.Errorf("job %s: %w\n(completed chunks are checkpointed: run the same command again to resume)", job, err)
	}
	return fmt.Errorf("job %s: %w", job, err)
}

// DatabaseURL returns the value of the DATABASE_URL environment variable,
// or an error naming the variable (and hint, how to get a server) when it
// is empty: an empty URL would make lib/pq fall back to its defaults
// (PGHOST, a local socket, the user's name), so the example could write
// into whatever database those happen to reach.
func DatabaseURL(hint string) (string, error) {
	url := os.Getenv("DATABASE_URL")
	if strings.TrimSpace(url) == "" {
		return "", Usage(fmt.Errorf("DATABASE_URL is not set: refusing to fall back to libpq defaults; set it to the PostgreSQL URL to load into (%s)", hint))
	}
	if err := pgurl.Check(url); err != nil {
		return "", Usage(fmt.Errorf("DATABASE_URL: %w", err))
	}
	return url, nil
}

// FindDataDir returns dir if it holds file, or, if dir is empty, the first
// of the usual places of example name's data that holds file:
// name/data, examples/name/data or data, depending on where the command
// runs from. The error names examples/name/fetch-data.sh.
func FindDataDir(dir, name, file string) (string, error) {
	cands := []string{dir}
	if dir == "" {
		cands = []string{name + "/data", "examples/" + name + "/data", "data"}
	}
	for _, d := range cands {
		if _, err := os.Stat(filepath.Join(d, file)); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s: run examples/%s/fetch-data.sh first", file, strings.Join(cands, ", "), name)
}

// Progress is a [backfill.Hooks] that prints one line per completed chunk
// to Out and counts the chunks and rows of this call. ChunkDone is called
// concurrently when Concurrency > 1, so lines may come out of Seq order.
type Progress struct {
	Out   io.Writer
	Total int // chunks in the job, printed after each chunk's number

	// Format is the line without its newline; empty: no line, only the
	// counting (a [Live] display shows the progress). Its verbs take, in order:
	// the batch id, the chunk's 1-based number, Total, the label, the
	// chunk's Read, Inserted, Updated, Unchanged, Rejected and
	// Deduplicated counts and its duration in seconds (float64).
	Format string
	// Label returns the label of a chunk; nil: the chunk's ID.
	Label func(backfill.Chunk) string
	// Attempts appends "  (attempt N)" to the line of a chunk that
	// needed more than one attempt.
	Attempts bool

	mu   sync.Mutex
	done int
	sum  backfill.Counts
}

var _ backfill.Hooks = (*Progress)(nil)

// ChunkDone implements [backfill.Hooks].
func (p *Progress) ChunkDone(ctx context.Context, batchID int64, r backfill.ChunkResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.sum = p.sum.Add(r.Counts)
	if p.Format == "" {
		return
	}
	label := r.Chunk.ID
	if p.Label != nil {
		label = p.Label(r.Chunk)
	}
	fmt.Fprintf(p.Out, p.Format,
		batchID, r.Chunk.Seq+1, p.Total, label, r.Read, r.Inserted, r.Updated, r.Unchanged, r.Rejected, r.Deduplicated,
		r.FinishedAt.Sub(r.StartedAt).Seconds())
	if p.Attempts && r.Attempt > 1 {
		fmt.Fprintf(p.Out, "  (attempt %d)", r.Attempt)
	}
	fmt.Fprintln(p.Out)
}

// Counts returns how many chunks completed so far and the sum of their
// counts.
func (p *Progress) Counts() (int, backfill.Counts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.sum
}

// Ledger is a run as the manifest recorded it.
type Ledger struct {
	Schema     string // the manifest's schema
	Run        backfill.Run
	States     []backfilltype.ChunkState
	Exceptions []backfill.Exception
}

// ReadLedger reads run batchID, its chunks and its exceptions from m.
func ReadLedger(ctx context.Context, db *sqlx.DB, m *backfill.PGManifest, batchID int64) (*Ledger, error) {
	run, err := m.Run(ctx, db, batchID)
	if err != nil {
		return nil, err
	}
	states, err := m.Chunks(ctx, db, batchID)
	if err != nil {
		return nil, err
	}
	exc, err := m.Exceptions(ctx, db, batchID)
	if err != nil {
		return nil, err
	}
	return &Ledger{Schema: m.Schema(), Run: run, States: states, Exceptions: exc}, nil
}

// SummaryFormat says how [Ledger.Summarize] differs between the commands.
type SummaryFormat struct {
	// UTC prints the run's creation time in UTC instead of in the
	// location the driver returned.
	UTC bool
	// Retried appends to the chunks line how many chunks needed more
	// than one attempt.
	Retried bool
	// ExceptionKey groups the exceptions, in order of first appearance;
	// nil: by Reason.
	ExceptionKey func(backfill.Exception) string
	// Rerun is the hint printed in parentheses when this call had
	// nothing to do, e.g. "-replay replays it".
	Rerun string
	// Rate appends the rows per second of this call.
	Rate bool
}

// Summarize prints the summary lines common to the commands: the header,
// the run, its chunks by status, the rows of its completed chunks, its
// exceptions and what this call (rep, p) did.
func (l *Ledger) Summarize(out io.Writer, rep backfill.Report, p *Progress, f SummaryFormat) {
	byStatus := map[backfill.ChunkStatus]int{}
	var total backfill.Counts
	retried := 0
	for _, s := range l.States {
		byStatus[s.Status]++
		if s.Status == backfill.ChunkDone || s.Status == backfill.ChunkOpen {
			total = total.Add(s.Counts)
		}
		if s.Attempts > 1 {
			retried++
		}
	}
	created := l.Run.CreatedAt
	if f.UTC {
		created = created.UTC()
	}
	fmt.Fprintf(out, "summary (from the manifest, schema %s)\n", l.Schema)
	fmt.Fprintf(out, "  run        batch %d, job %s, status %s, resumed %t, created %s\n",
		l.Run.BatchID, l.Run.Job, l.Run.Status, rep.Resumed, created.Format(time.RFC3339))
	fmt.Fprintf(out, "  chunks     %d total: %d done, %d pending, %d failed",
		len(l.States), byStatus[backfill.ChunkDone], byStatus[backfill.ChunkPending], byStatus[backfill.ChunkFailed])
	if n := byStatus[backfill.ChunkOpen]; n > 0 {
		fmt.Fprintf(out, ", %d open (ending after the watermark or now: the next run reads them again)", n)
	}
	if f.Retried {
		fmt.Fprintf(out, "; %d needed more than one attempt", retried)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  rows       %d read: %d inserted, %d updated, %d unchanged, %d rejected, %d deduplicated (balanced: %t)\n",
		total.Read, total.Inserted, total.Updated, total.Unchanged, total.Rejected, total.Deduplicated, total.Balanced())
	fmt.Fprintf(out, "  exceptions %d in the queue", len(l.Exceptions))
	key := f.ExceptionKey
	if key == nil {
		key = func(e backfill.Exception) string { return e.Reason }
	}
	var reasons []string
	count := map[string]int{}
	for _, e := range l.Exceptions {
		r := key(e)
		if count[r] == 0 {
			reasons = append(reasons, r)
		}
		count[r]++
	}
	for _, r := range reasons {
		fmt.Fprintf(out, "; %d x %q", count[r], r)
	}
	fmt.Fprintln(out)

	ran, this := p.Counts()
	switch {
	case ran == 0:
		fmt.Fprintf(out, "  this call  nothing to do: the run was complete (%s)\n", f.Rerun)
	case f.Rate:
		fmt.Fprintf(out, "  this call  %d chunks, %d rows in %s = %.0f rows/s\n",
			ran, this.Read, rep.Elapsed.Round(time.Millisecond), float64(this.Read)/max(rep.Elapsed.Seconds(), 1e-3))
	default:
		fmt.Fprintf(out, "  this call  %d chunks, %d rows in %s\n", ran, this.Read, rep.Elapsed.Round(time.Millisecond))
	}
}

// PeakRSS returns VmHWM from /proc/self/status (Linux), or "unknown".
func PeakRSS() string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// resumeCommands says how to resume job's latest run, with the operator's
// command and with SQL, each pasteable whatever the job's name.
func resumeCommands(job string) string {
	sql := "SELECT backfill.resume(" + quote.SQL(job) + ", '<you>', '<why>')"
	return "go -C cmd/backfill run . resume --job " + quote.Shell(job) + " --why '<why>' (from the repository's root), or psql \"$DATABASE_URL\" -c " + quote.Shell(sql)
}
