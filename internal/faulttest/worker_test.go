//go:build faults

package faulttest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/pgbackfill/backfill"
)

// event is something a worker process did, as the suite saw it: started,
// began extracting a chunk, committed one, failed one, logged a wait,
// exited.
type event struct {
	at     time.Time
	worker int
	kind   string // start, joined (Run began working), extract, done, failed, wait, exit
	seq    int
	code   int // exit
	// wait: the library's record of a wait for chunks held by others.
	msg    string
	holder string        // the holder's worker ID ("" on the wait's last record)
	waited time.Duration // how long the worker has waited so far
	fenced bool          // the holder was fenced
}

// Messages of the library's wait records: each carries "waited", those about one chunk
// also "holder".
var waitMessages = map[string]bool{
	"backfill: waiting for a chunk in flight":                           true,
	"backfill: waiting for a chunk held by a stale worker (not fenced)": true,
	fencedMessage: true,
	"backfill: done waiting for chunks in flight": true,
	"backfill: chunks in flight ended":            true,
	// Waits for a lock (the merge's key locks) held by another worker.
	"backfill: waiting for a lock held by a live worker":                           true,
	"backfill: waiting for a lock held by a stale worker (not fenced)":             true,
	"backfill: waiting for a lock held by a session that is not a backfill worker": true,
	lockFencedMessage: true,
}

// lockFencedMessage is fencedMessage for the holder of a lock.
const lockFencedMessage = "backfill: fenced a stale worker: terminated the backend holding a lock this transaction waits for; its transaction rolls back"

const fencedMessage = "backfill: fenced a stale worker: terminated the backend holding the chunk; its transaction rolls back and the chunk is claimable"

// leaseLostMessage is what a worker logs when its chunk's fence finds
// the lease taken over while it extracted: the
// short-transaction form of being fenced, its attempt cannot commit.
const leaseLostMessage = "backfill: chunk's fence failed: its lease was taken over (this worker was stale) or the run stopped meanwhile (paused, abandoned); its transaction rolls back"

// worker is one worker process slot, supervised like an orchestrator
// would (a Kubernetes Job's pod with restartPolicy OnFailure), by the
// exit codes of backfill.Work: restarted when killed or when it exits 1
// (failed) or 75 (resume later), left alone once it exits 0 (done) or 64
// (bad job or configuration).
type worker struct {
	r    *round
	idx  int
	id   string // WorkerID in the manifest
	host *host
	url  string
	via  string // "direct" or "pgbouncer"

	mu         sync.Mutex
	proc       *os.Process // nil when not running
	killedByUs bool
	stopped    bool // SIGSTOPped by the suite
	starts     int
	lastError  string // the error of the last ERROR record
	logPath    string
}

func (w *worker) running() (*os.Process, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.proc, w.proc != nil && !w.stopped
}

// supervise runs the worker until it exits 0 or stop is closed.
func (w *worker) supervise(stop <-chan struct{}) {
	failures := 0
	for {
		code, err := w.runOnce()
		w.mu.Lock()
		killed := w.killedByUs
		w.killedByUs = false
		lastErr := w.lastError
		w.mu.Unlock()
		switch {
		case err != nil:
			w.r.noteExit(w, -1, fmt.Sprintf("cannot start: %v", err))
			failures++
		case killed:
			failures = 0
		case code == 0:
			return
		case code == int(backfill.ExitUsage):
			// Restarting cannot help (the orchestrator's contract).
			w.r.noteExit(w, code, lastErr)
			return
		default: // 1 failed, 75 resume later: restarted
			w.r.noteExit(w, code, lastErr)
			failures++
		}
		backoff := 100 * time.Millisecond << min(failures, 4)
		select {
		case <-stop:
			return
		case <-time.After(backoff):
		}
	}
}

// runOnce starts the worker process and waits for it to exit. It returns
// the exit code (-1 for a signal).
func (w *worker) runOnce() (int, error) {
	s := w.r.s
	sp := w.r.spec
	cmd := w.host.command(s.workerBin,
		"-url", w.url, "-job", sp.Name, "-table", sp.Table,
		"-chunks", fmt.Sprint(sp.Chunks), "-rows", fmt.Sprint(sp.RowsPerChunk),
		"-sleep", sp.Sleep.String(), "-id", w.id,
		"-heartbeat", heartbeatInterval.String(), "-stale-after", staleAfter.String(),
		// Every other worker extracts ahead (a chunk leased and spooled
		// while the previous one is written).
		fmt.Sprintf("-extract-ahead=%t", w.idx%2 == 1), "-merged-pause", w.r.mergedPause.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	logf, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	w.mu.Lock()
	w.proc = cmd.Process
	w.starts++
	w.mu.Unlock()
	w.r.record(event{at: time.Now(), worker: w.idx, kind: "start"})

	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		at := time.Now()
		_, _ = logf.Write(append(line, '\n'))
		var rec struct {
			Msg    string         `json:"msg"`
			Seq    *int           `json:"seq"`
			Error  string         `json:"error"`
			Level  string         `json:"level"`
			Holder string         `json:"holder"`
			Waited *time.Duration `json:"waited"` // slog writes a Duration in nanoseconds
		}
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		switch {
		case rec.Msg == "backfill run":
			w.r.record(event{at: at, worker: w.idx, kind: "joined"})
		case rec.Msg == "extract" && rec.Seq != nil:
			w.r.record(event{at: at, worker: w.idx, kind: "extract", seq: *rec.Seq})
		case rec.Msg == "chunk done" && rec.Seq != nil:
			w.r.record(event{at: at, worker: w.idx, kind: "done", seq: *rec.Seq})
		case rec.Msg == "chunk failed" && rec.Seq != nil:
			w.r.record(event{at: at, worker: w.idx, kind: "failed", seq: *rec.Seq})
		case rec.Msg == "merged" && rec.Seq != nil:
			select {
			case w.r.merged <- event{at: at, worker: w.idx, kind: "merged", seq: *rec.Seq}:
			default:
			}
		case rec.Msg == leaseLostMessage && rec.Seq != nil:
			w.r.record(event{at: at, worker: w.idx, kind: "lease-lost", seq: *rec.Seq})
		case waitMessages[rec.Msg] && rec.Waited != nil:
			e := event{at: at, worker: w.idx, kind: "wait", seq: -1, msg: rec.Msg, holder: rec.Holder, waited: *rec.Waited, fenced: rec.Msg == fencedMessage || rec.Msg == lockFencedMessage}
			if rec.Seq != nil {
				e.seq = *rec.Seq
			}
			w.r.record(e)
		case rec.Error != "" && rec.Level == "ERROR":
			w.mu.Lock()
			w.lastError = rec.Error
			w.mu.Unlock()
		}
	}
	err = cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return 0, err
	}
	w.mu.Lock()
	w.proc = nil
	w.stopped = false
	killed := w.killedByUs
	w.mu.Unlock()
	if killed {
		w.r.noteCode(-1)
	} else {
		w.r.noteCode(code)
	}
	w.r.record(event{at: time.Now(), worker: w.idx, kind: "exit", code: code})
	return code, nil
}

// signal sends sig to the worker's process if it runs.
func (w *worker) signal(sig syscall.Signal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.proc == nil {
		return false
	}
	switch sig {
	case syscall.SIGKILL:
		w.killedByUs = true
	case syscall.SIGSTOP:
		w.stopped = true
	case syscall.SIGCONT:
		w.stopped = false
	}
	return w.proc.Signal(sig) == nil
}

func workerLogPath(dir string, round, idx int) string {
	return filepath.Join(dir, fmt.Sprintf("round%d-worker%d.log", round, idx))
}
