package backfill

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitSleepAfterConflict: a serialization failure or a deadlock is
// retried after 20 ms doubled on each try, never more than the retry
// table's row; a lock or statement timeout keeps the row's sleep.
func TestWaitSleepAfterConflict(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		require.Equal(t, 20*time.Millisecond, waitSleep(code, 0, time.Second), code)
		require.Equal(t, 40*time.Millisecond, waitSleep(code, 1, time.Second), code)
		require.Equal(t, 320*time.Millisecond, waitSleep(code, 4, 5*time.Second), code)
		require.Equal(t, 2*time.Second, waitSleep(code, 7, 2*time.Second), code)
		require.Equal(t, 10*time.Second, waitSleep(code, 60, 10*time.Second), code)
	}
	for _, code := range []string{"55P03", "57014"} {
		require.Equal(t, time.Second, waitSleep(code, 0, time.Second), code)
	}
}
