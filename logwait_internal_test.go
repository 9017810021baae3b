package backfill

import (
	"context"
	"log/slog"
	"sync"
)

// logEvent is a logger whose channel is closed the first time it logs a
// record with message msg: a test waits on it for what the engine did
// (and logged) rather than for a fixed time.
func logEvent(msg string) (*slog.Logger, <-chan struct{}) {
	h := &eventHandler{msg: msg, ch: make(chan struct{})}
	return slog.New(h), h.ch
}

type eventHandler struct {
	msg  string
	once sync.Once
	ch   chan struct{}
}

func (h *eventHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *eventHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}
func (h *eventHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *eventHandler) WithGroup(string) slog.Handler      { return h }
