package backfilltype

import (
	"time"
)

// Defaults of backfill.Config.HeartbeatInterval and
// backfill.Config.StaleAfter: a healthy worker waits behind a frozen one at
// most about 36 s, within the documented bound of one minute.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultStaleAfter        = 30 * time.Second
)
