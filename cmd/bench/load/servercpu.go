package main

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// backends tracks the server processes of every connection a child opens,
// so that their CPU is counted even when the connection closes before the
// load ends: the library closes some of its connections during a run, and
// reading only the backends still connected at the end (pg_stat_activity)
// left their CPU out, by a varying amount from run to run (a replay's
// server CPU read 0.8 s in one run and 2.4 s in the next of the same
// load). A connector asks each new connection for its backend's pid, and
// a sampler reads the CPU of every known backend from /proc every 20 ms:
// a backend that exits loses at most its last 20 ms.
type backends struct {
	driver.Connector

	mu   sync.Mutex
	cpu  map[int]float64 // pid -> CPU seconds last read; -1: not readable
	stop chan struct{}
	done chan struct{}
}

func newBackends(c driver.Connector) *backends {
	b := &backends{Connector: c, cpu: map[int]float64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				b.sample()
			}
		}
	}()
	return b
}

// Connect implements driver.Connector: the inner connector's connection,
// its backend's pid recorded.
func (b *backends) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := b.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	q, ok := c.(driver.QueryerContext)
	if !ok {
		return c, nil
	}
	rows, err := q.QueryContext(ctx, `SELECT pg_backend_pid()`, nil)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("backend pid: %w", err)
	}
	dest := make([]driver.Value, 1)
	err = rows.Next(dest)
	rows.Close()
	if err != nil && err != io.EOF {
		c.Close()
		return nil, fmt.Errorf("backend pid: %w", err)
	}
	if pid, ok := dest[0].(int64); ok {
		b.mu.Lock()
		if _, seen := b.cpu[int(pid)]; !seen {
			b.cpu[int(pid)] = procCPU(int(pid))
		}
		b.mu.Unlock()
	}
	return c, nil
}

// sample reads the CPU of every known backend still running.
func (b *backends) sample() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for pid := range b.cpu {
		if v := procCPU(pid); v >= 0 {
			b.cpu[pid] = v
		}
	}
}

// total stops the sampler and returns the CPU seconds of every backend
// the child's connections had, or -1 when one was not readable (a remote
// server).
func (b *backends) total() float64 {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
	b.sample()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cpu) == 0 {
		return -1
	}
	total := 0.0
	for _, v := range b.cpu {
		if v < 0 {
			return -1
		}
		total += v
	}
	return total
}

// procCPU returns the CPU seconds (user+system) of PostgreSQL process pid
// from /proc, or -1 when it is not a visible postgres process.
func procCPU(pid int) float64 {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return -1
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// After the comm: state(3) ... utime(14) stime(15), 1-based.
	if len(f) < 13 {
		return -1
	}
	hz := 100.0 // USER_HZ: 100 on every Linux ABI Go supports
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / hz
}
