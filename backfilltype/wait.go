package backfilltype

import (
	"time"
)

// Blocker is a session that blocks, or holds a lock on, what the library
// waits for ([Wait.Blockers], the log, [ErrPublishBlocked]).
type Blocker struct {
	// PID is the session's backend process ID.
	PID int `db:"pid" json:"pid"`
	// ApplicationName, State, WaitEvent and Query are the session's in
	// pg_stat_activity (Query cut at 200 bytes).
	ApplicationName string `db:"app" json:"application_name"`
	State           string `db:"state" json:"state"`
	WaitEvent       string `db:"wait_event" json:"wait_event,omitempty"`
	Query           string `db:"query" json:"query"`
	// Mode is the lock mode it holds, when known.
	Mode string `db:"mode" json:"mode,omitempty"`
}

// Wait is one try of a chunk that waited and was rolled back
// (backfilldriver.ManifestWaits).
type Wait struct {
	// ID is the record's ID, in the order recorded (set by the manifest).
	ID int64 `db:"id" json:"id"`
	// BatchID, Seq and ChunkID name the chunk.
	BatchID int64  `db:"batch_id" json:"batch_id"`
	Seq     int    `db:"seq" json:"seq"`
	ChunkID string `db:"chunk_id" json:"chunk_id"`
	// Attempt is the chunk's attempt (as in [ChunkError.Attempt]); Try
	// is the 1-based row of backfill.Config.LockRetries the try ran with.
	Attempt int `db:"attempt" json:"attempt"`
	Try     int `db:"try" json:"try"`
	// SQLState is 55P03 (lock timeout), 40P01 (deadlock), 40001
	// (serialization failure) or 57014 (statement timeout or cancel);
	// Message is PostgreSQL's.
	SQLState string `db:"sqlstate" json:"sqlstate"`
	Message  string `db:"message" json:"message"`
	// LockTimeout and StatementTimeout are the settings of the try as
	// PostgreSQL reads them ("2000" ms; "" when the library set none).
	LockTimeout      string `db:"lock_timeout" json:"lock_timeout"`
	StatementTimeout string `db:"statement_timeout" json:"statement_timeout"`
	// Waited is how long the statement that ended the try had been
	// waiting (lock waits: since pg_locks.waitstart) or running, as last
	// seen by the watcher plus the time since; the timeout when the
	// watcher never saw it.
	Waited time.Duration `db:"-" json:"waited"`
	// Blockers are the sessions that blocked it (pg_blocking_pids), as
	// last seen while it waited; empty when none were seen.
	Blockers []Blocker `db:"-" json:"blockers"`
	// Sleep is the pause before the next try; Final reports that the
	// wait was on the table's last row and ended the attempt as failed.
	Sleep time.Duration `db:"-" json:"sleep"`
	Final bool          `db:"final" json:"final"`
	// Worker is backfill.Config.WorkerID; At is when it was recorded (server
	// clock).
	Worker string    `db:"worker" json:"worker"`
	At     time.Time `db:"at" json:"at"`
}
