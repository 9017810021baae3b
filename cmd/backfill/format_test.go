package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFormat: thousands separators and human durations.
func TestFormat(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 12345: "12,345", 1234567: "1,234,567", -1234567: "-1,234,567",
		-999: "-999", 9223372036854775807: "9,223,372,036,854,775,807"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{-time.Second: "-", 0: "0s", 850 * time.Millisecond: "850ms", 12340 * time.Millisecond: "12.3s",
		4*time.Minute + 5*time.Second: "4m05s", 2*time.Hour + 7*time.Minute + 20*time.Second: "2h07m", 76 * time.Hour: "3d04h"} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
	if got := utc(nil); got != "-" {
		t.Errorf("utc(nil) = %q", got)
	}
	ts := time.Date(2024, 3, 1, 1, 2, 3, 0, time.FixedZone("X", 3600))
	if got := utc(&ts); got != "2024-03-01 00:02:03Z" {
		t.Errorf("utc = %q", got)
	}
	if got := clip("a\nb\tcdef", 5); got != "a b c … (8 characters)" {
		t.Errorf("clip = %q", got)
	}
	if got := clip("a\nb", 5); got != "a b" {
		t.Errorf("clip = %q", got)
	}
}

// TestWaitNotes: the rollback command's log passes warnings on, and of
// the INFO records only the first wait for a chunk in flight and the
// end of the wait.
func TestWaitNotes(t *testing.T) {
	var buf strings.Builder
	log := slog.New(newWaitNotes(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))).With("cmd", "rollback")
	for range 3 {
		log.Info("backfill: waiting for a chunk in flight", "seq", 4)
	}
	log.Info("backfill: something else")
	log.Warn("backfill: fenced a stale worker")
	log.Info("backfill: chunks in flight ended")
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "waiting for a chunk in flight"), out)
	require.Contains(t, out, "seq=4")
	require.Contains(t, out, "cmd=rollback")
	require.NotContains(t, out, "something else")
	require.Contains(t, out, "fenced a stale worker")
	require.Contains(t, out, "chunks in flight ended")
}
