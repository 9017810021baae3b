package backfilltype

import (
	"time"
)

// LockRetry is one row of backfill.Config.LockRetries: a try's lock_timeout
// and, when the try waits, the sleep before the next try.
type LockRetry struct {
	// Timeout is the lock_timeout of the try, at most Config.LockTimeout;
	// 0 means Config.LockTimeout (the bound of every lock wait).
	Timeout time.Duration
	// Sleep is the pause after the try waited, jittered by ±25 %.
	Sleep time.Duration
}

// DefaultLockTimeout is the default of backfill.Config.LockTimeout.
const DefaultLockTimeout = 2 * time.Second

// DefaultLockRetries returns the default retry table for lockTimeout
// (after GitLab's lock retries): lock_timeout lockTimeout/20, /10, /4,
// /2, then lockTimeout four times, with sleeps 1 s, 1 s, 2 s, 5 s, 10 s,
// 10 s, 20 s (the last row's Sleep is not used: a wait on it ends the
// attempt). For the default 2 s: 100 ms/1 s, 200 ms/1 s, 500 ms/2 s,
// 1 s/5 s, 2 s/10 s, 2 s/10 s, 2 s/20 s, 2 s: an attempt waits at most
// 9.8 s in all and sleeps about 49 s before it counts as failed. A
// non-positive lockTimeout gives zero timeouts.
func DefaultLockRetries(lockTimeout time.Duration) []LockRetry {
	lt := max(lockTimeout, 0)
	return []LockRetry{
		{lt / 20, time.Second}, {lt / 10, time.Second}, {lt / 4, 2 * time.Second}, {lt / 2, 5 * time.Second},
		{lt, 10 * time.Second}, {lt, 10 * time.Second}, {lt, 20 * time.Second}, {lt, 0},
	}
}
