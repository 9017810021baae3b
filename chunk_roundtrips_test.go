package backfill

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

// tripProxy forwards TCP connections to a PostgreSQL server and counts
// the client's round trips by the frontend messages that wait for the
// server: a simple Query ('Q'), a Sync ('S': lib/pq ends each step of a
// statement with parameters with one) and a CopyDone ('c'). Each is
// recorded under the text of the statement it belongs to (for a Sync,
// the connection's last Parse).
type tripProxy struct {
	ln net.Listener
	to string

	mu    sync.Mutex
	trips map[string]int
	seq   []string
}

func newTripProxy(t *testing.T, to string) *tripProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tripProxy{ln: ln, to: to, trips: map[string]int{}}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *tripProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		_ = c.Close()
		return
	}
	defer func() { _ = s.Close(); _ = c.Close() }()
	go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
	// The startup message (and an SSLRequest before it): a length, no type.
	head := make([]byte, 4)
	for started := false; !started; {
		if _, err := io.ReadFull(c, head); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head)-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if _, err := s.Write(append(head, body...)); err != nil {
			return
		}
		started = !(len(body) >= 4 && binary.BigEndian.Uint32(body) == 80877103) // not an SSLRequest
	}
	var parsed string
	msg := make([]byte, 5)
	for {
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(msg[1:])-4)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		text := func(b []byte) string {
			if i := strings.IndexByte(string(b), 0); i >= 0 {
				b = b[:i]
			}
			return strings.Join(strings.Fields(string(b)), " ")
		}
		switch msg[0] {
		case 'P': // Parse: statement name, then its text
			name := text(body)
			parsed = text(body[len(name)+1:])
		case 'Q':
			p.add(text(body))
		case 'S':
			p.add(parsed)
		case 'c':
			p.add("CopyDone")
		}
		if _, err := s.Write(append(msg, body...)); err != nil {
			return
		}
	}
}

func (p *tripProxy) add(q string) {
	if len(q) > 120 {
		q = q[:120] + "..."
	}
	p.mu.Lock()
	p.trips[q]++
	p.seq = append(p.seq, q)
	p.mu.Unlock()
}

// take returns the round trips counted so far and starts counting anew.
func (p *tripProxy) take() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.trips
	p.trips, p.seq = map[string]int{}, nil
	return m
}

// TestChunkRoundTrips counts the client's round trips per chunk of a run
// on the default path (short transactions, a registered worker), as the
// difference between a run of 3 chunks and one of 13, divided by 10
// (issue 15, per-chunk overhead: each one is a wait for the server). The
// heartbeats, which are timed, are left out. With -v it logs the round
// trips of the run of 3 chunks in order.
func TestChunkRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	pu, err := url.Parse(u)
	require.NoError(t, err)
	p := newTripProxy(t, pu.Host)
	pu.Host = p.ln.Addr().String()
	db, err := sqlx.Open("postgres", pu.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	r, err := New(db, &Config{WorkerID: "trips"})
	require.NoError(t, err)

	run := func(name string, chunks int) map[string]int {
		job := liveJob(nil)
		job.Name = name
		job.Chunker = IntRange(0, int64(10*chunks), 10)
		p.take()
		_, err := r.Run(ctx, job)
		require.NoError(t, err)
		if testing.Verbose() && chunks == 3 {
			t.Logf("sequence:\n%s", strings.Join(p.seq, "\n"))
		}
		m := p.take()
		for q := range m {
			// Timed, not per chunk.
			if strings.Contains(q, "heartbeat_at") {
				delete(m, q)
			}
		}
		return m
	}
	// A first run warms up what a runner does once (migrations).
	run("warm", 1)
	few, many := run("few", 3), run("many", 13)
	var lines []string
	total := 0
	for q, n := range many {
		d := n - few[q]
		total += d
		if d != 0 {
			lines = append(lines, fmt.Sprintf("%5.1f %s", float64(d)/10, q))
		}
	}
	sort.Strings(lines)
	t.Logf("round trips per chunk: %.1f\n%s", float64(total)/10, strings.Join(lines, "\n"))
	// 41.8 at the start of issue 15's work (a control poll and a totals
	// read of their own per chunk, every savepoint, setting and lock a
	// statement of its own); 20.2 after it.
	require.LessOrEqual(t, total, 10*22, "round trips per chunk (x10)")
}
