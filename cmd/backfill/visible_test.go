package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVisible: control characters from the data are shown, not sent to
// the terminal; text, tabs, newlines (when kept) and UTF-8 split across
// writes pass through unchanged.
func TestVisible(t *testing.T) {
	t.Parallel()
	require.Equal(t, `\x1b]0;pwned\x07\x1b[2J`, visible("\x1b]0;pwned\x07\x1b[2J", true))
	require.Equal(t, "a\tb\nc", visible("a\tb\nc", true))
	require.Equal(t, `a\x0ab`, visible("a\nb", false))
	require.Equal(t, `\x9b`, visible("\u009b", true))
	require.Equal(t, "Zürich 東京", visible("Zürich 東京", true))
	var out bytes.Buffer
	w := visibleWriter{&out}
	b := []byte("Zürich\x1b[2J")
	for i := range b { // one byte at a time: a rune cut in two stays whole
		_, err := w.Write(b[i : i+1])
		require.NoError(t, err)
	}
	require.Equal(t, `Zürich\x1b[2J`, out.String())
}
