// Package pgproxy is a TCP proxy for the PostgreSQL wire protocol that
// tests put between a client and a server to watch the client's
// statements and to cut its connections at chosen messages.
//
// The proxy reads the frontend (client to server) message stream: the
// untyped startup messages (an optional SSLRequest, then the startup
// message), then typed messages (a type byte, a 4-byte big-endian length
// that counts itself, a body). Each typed message is passed to the
// connection's Hook before it is forwarded; the Hook's Action says
// whether to forward it, cut the connection before it reaches the
// server, or forward it and cut the client off before the server's
// answer reaches it. The server's answers are copied back as they come,
// unparsed.
package pgproxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync/atomic"
)

// sslRequestCode is the request code of an SSLRequest startup message.
const sslRequestCode = 80877103

// Action is what the proxy does with a frontend message, as a Hook
// decides.
type Action int

const (
	// Forward sends the message to the server and goes on.
	Forward Action = iota
	// CutBefore closes both sides of the connection without sending the
	// message: the server never sees it (an open transaction rolls back).
	CutBefore
	// CutAfter sends the message to the server, then closes the client's
	// side and drops whatever the server answers from then on: the
	// server acts on the message (a COMMIT commits), the client never
	// hears it. The server's side is closed once its next answer arrives.
	CutAfter
)

// Message is one typed frontend message, as a Hook sees it.
type Message struct {
	// Type is the message's type byte: 'P' Parse, 'Q' Query, 'S' Sync,
	// 'B' Bind, 'E' Execute, 'D' Describe, 'd' CopyData, 'c' CopyDone,
	// 'X' Terminate, and so on.
	Type byte
	// Statement is the text of the statement the message belongs to,
	// its whitespace folded to single spaces: for a Query the query's
	// text, for a Parse the statement it parses, for any other message
	// the statement of the connection's last Parse ("" before the
	// first).
	Statement string
}

// Hook decides what to do with each typed frontend message of one
// connection. The proxy calls it in the order of the messages, from one
// goroutine per connection; the hooks of different connections run
// concurrently.
type Hook func(Message) Action

// Proxy accepts TCP connections and relays each to the server, passing
// the client's messages through a Hook of the connection's own.
type Proxy struct {
	ln      net.Listener
	to      string
	newHook func() Hook
}

// Listen starts a proxy listening on addr (host:port, port 0 for any
// free one) that relays each connection it accepts to the server at to
// (host:port). newHook is called once per accepted connection and gives
// the Hook of that connection (nil: every message is forwarded), which
// may keep the connection's own state. The proxy serves until Close.
func Listen(addr, to string, newHook func() Hook) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, to: to, newHook: newHook}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p, nil
}

// Addr returns the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Close stops accepting connections. Connections already accepted go on
// until either side closes them.
func (p *Proxy) Close() error { return p.ln.Close() }

// serve relays client connection c to a new connection to the server.
func (p *Proxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		_ = c.Close()
		return
	}
	var hook Hook
	if p.newHook != nil {
		hook = p.newHook()
	}
	// The server's answers, until muted (CutAfter).
	var muted atomic.Bool
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !muted.Load() {
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil || muted.Load() {
				break
			}
		}
		_ = c.Close()
		_ = s.Close()
	}()
	if relay(c, s, hook, &muted) != CutAfter {
		_ = s.Close()
	}
	// After CutAfter the server's side stays open for its answer, which
	// the reader above drops before closing it.
	_ = c.Close()
}

// relay copies the client's messages from c to s, asking hook about each
// typed one, until a read or write fails (it returns Forward) or hook
// cuts the connection (it returns the Action, having muted the server's
// answers for CutAfter).
func relay(c, s net.Conn, hook Hook, muted *atomic.Bool) Action {
	// The startup message, and an SSLRequest before it: a length, no type.
	head := make([]byte, 4)
	for started := false; !started; {
		body, ok := readBody(c, head)
		if !ok {
			return Forward
		}
		if _, err := s.Write(append(head, body...)); err != nil {
			return Forward
		}
		started = !(len(body) >= 4 && binary.BigEndian.Uint32(body) == sslRequestCode)
	}
	var parsed string // the statement of the connection's last Parse
	msg := make([]byte, 5)
	for {
		if _, err := io.ReadFull(c, msg[:1]); err != nil {
			return Forward
		}
		body, ok := readBody(c, msg[1:])
		if !ok {
			return Forward
		}
		m := Message{Type: msg[0], Statement: parsed}
		switch msg[0] {
		case 'P': // Parse: the statement's name, then its text
			_, rest, _ := bytes.Cut(body, []byte{0})
			parsed = cString(rest)
			m.Statement = parsed
		case 'Q':
			m.Statement = cString(body)
		}
		act := Forward
		if hook != nil {
			act = hook(m)
		}
		if act == CutBefore {
			return CutBefore
		}
		if act == CutAfter {
			muted.Store(true)
		}
		if _, err := s.Write(append(msg, body...)); err != nil {
			return Forward
		}
		if act == CutAfter {
			return CutAfter
		}
	}
}

// readBody reads a message's 4-byte length into head (which it fills)
// and then the body that length announces; ok is false when the read
// fails or the length is less than 4.
func readBody(c io.Reader, head []byte) (body []byte, ok bool) {
	if _, err := io.ReadFull(c, head); err != nil {
		return nil, false
	}
	n := binary.BigEndian.Uint32(head)
	if n < 4 {
		return nil, false
	}
	body = make([]byte, n-4)
	if _, err := io.ReadFull(c, body); err != nil {
		return nil, false
	}
	return body, true
}

// cString returns the NUL-terminated string at the start of b (all of b
// without a NUL), its whitespace folded to single spaces.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return strings.Join(strings.Fields(string(b)), " ")
}
