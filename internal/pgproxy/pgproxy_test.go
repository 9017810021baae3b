package pgproxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// msg encodes a frontend message of type typ (0: an untyped startup
// message) whose body is the NUL-terminated strings of body.
func msg(typ byte, body ...string) []byte {
	var b []byte
	for _, s := range body {
		b = append(append(b, s...), 0)
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(b)+4))
	if typ != 0 {
		out = append([]byte{typ}, out...)
	}
	return append(out, b...)
}

var startup = msg(0, "\x00\x03\x00\x00user", "u", "")

// server stands in for PostgreSQL: it accepts one connection and records
// the bytes it receives until the proxy closes its side.
type server struct {
	ln     net.Listener
	mu     sync.Mutex
	got    []byte
	conn   chan net.Conn // the accepted connection
	closed chan struct{} // closed when the proxy closed its side
}

func newServer(t *testing.T) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	s := &server{ln: ln, conn: make(chan net.Conn, 1), closed: make(chan struct{})}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { _ = c.Close() })
		s.conn <- c
		buf := make([]byte, 1024)
		for {
			n, err := c.Read(buf)
			s.mu.Lock()
			s.got = append(s.got, buf[:n]...)
			s.mu.Unlock()
			if err != nil {
				close(s.closed)
				return
			}
		}
	}()
	return s
}

func (s *server) received() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.got)
}

// recorder is a Hook factory that records the messages it sees and
// returns act for the one of index at.
type recorder struct {
	at  int
	act Action

	mu   sync.Mutex
	seen []Message
}

func (r *recorder) hook() Hook {
	return func(m Message) Action {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.seen = append(r.seen, m)
		if len(r.seen)-1 == r.at {
			return r.act
		}
		return Forward
	}
}

func (r *recorder) messages() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// connect starts a server and a proxy to it with r's hook, and returns
// the server and a client connection through the proxy that sent msgs.
func connect(t *testing.T, r *recorder, msgs ...[]byte) (*server, net.Conn) {
	t.Helper()
	srv := newServer(t)
	p, err := Listen("127.0.0.1:0", srv.ln.Addr().String(), r.hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write(slices.Concat(msgs...)); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestForward: every message reaches the server unchanged, and the hook
// sees each typed one with the statement it belongs to.
func TestForward(t *testing.T) {
	msgs := [][]byte{
		startup,
		msg('S'),
		msg('P', "", "SELECT\n  $1", ""),
		msg('S'),
		msg('Q', "BEGIN  ISOLATION LEVEL\tSERIALIZABLE"),
		msg('P', "s1", "INSERT INTO t VALUES ($1)", ""),
		msg('B', "", "s1"),
		msg('c'),
	}
	r := &recorder{at: -1}
	srv, c := connect(t, r, msgs...)
	want := slices.Concat(msgs...)
	waitFor(t, "the server to receive every message", func() bool { return len(srv.received()) >= len(want) })
	if got := srv.received(); !bytes.Equal(got, want) {
		t.Fatalf("the server received %q, want %q", got, want)
	}
	wantSeen := []Message{{'S', ""}, {'P', "SELECT $1"}, {'S', "SELECT $1"}, {'Q', "BEGIN ISOLATION LEVEL SERIALIZABLE"},
		{'P', "INSERT INTO t VALUES ($1)"}, {'B', "INSERT INTO t VALUES ($1)"}, {'c', "INSERT INTO t VALUES ($1)"}}
	if got := r.messages(); !slices.Equal(got, wantSeen) {
		t.Fatalf("the hook saw %q, want %q", got, wantSeen)
	}
	// The server's answers reach the client.
	sc := <-srv.conn
	if _, err := sc.Write([]byte("Z")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'Z' {
		t.Fatalf("the client read %q, %v; want Z", b, err)
	}
}

// TestSSLRequest: an SSLRequest before the startup message is forwarded
// as an untyped message too.
func TestSSLRequest(t *testing.T) {
	ssl := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), sslRequestCode)
	r := &recorder{at: -1}
	connect(t, r, ssl, startup, msg('Q', "SELECT 1"))
	waitFor(t, "the hook to see the query", func() bool { return len(r.messages()) == 1 })
	if got := r.messages(); got[0] != (Message{'Q', "SELECT 1"}) {
		t.Fatalf("the hook saw %q", got)
	}
}

// TestCutBefore: the message is not forwarded, and both sides are closed.
func TestCutBefore(t *testing.T) {
	r := &recorder{at: 1, act: CutBefore}
	srv, c := connect(t, r, startup, msg('Q', "BEGIN"), msg('Q', "COMMIT"), msg('Q', "SELECT 1"))
	<-srv.closed
	if got, want := srv.received(), slices.Concat(startup, msg('Q', "BEGIN")); !bytes.Equal(got, want) {
		t.Fatalf("the server received %q, want %q", got, want)
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the client read %d bytes, want its connection closed", n)
	}
}

// TestCutAfter: the message is forwarded, the client's side is closed
// without the server's answer, and the server's side once it answers.
func TestCutAfter(t *testing.T) {
	r := &recorder{at: 1, act: CutAfter}
	srv, c := connect(t, r, startup, msg('Q', "BEGIN"), msg('Q', "COMMIT"), msg('Q', "SELECT 1"))
	want := slices.Concat(startup, msg('Q', "BEGIN"), msg('Q', "COMMIT"))
	waitFor(t, "the server to receive the COMMIT", func() bool { return len(srv.received()) >= len(want) })
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the client read %d bytes, want its connection closed", n)
	}
	sc := <-srv.conn
	if _, err := sc.Write([]byte("C")); err != nil {
		t.Fatal(err)
	}
	<-srv.closed
	if got := srv.received(); !bytes.Equal(got, want) {
		t.Fatalf("the server received %q, want %q", got, want)
	}
}
