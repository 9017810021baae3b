package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// Liveness and fencing of the workers of a run (see doc.go, "Many workers
// and hosts").
//
// Each call of [Runner.Run] registers a row in the manifest's workers
// table (a random worker key), refreshes its heartbeat_at every
// [Config.HeartbeatInterval] from a goroutine of its own, and marks it
// finished when it returns. Every time is the server's now(), so the
// clocks of the hosts do not matter.
//
// A chunk is leased across transactions (lease_key, lease_epoch;
// internal/pgstore/lease.go, [backfilldriver.ManifestLeases]) while it is
// extracted outside any transaction; its short transaction then holds the
// row lock of the chunk's manifest row (the fence). The fence statement
// tags the transaction's backend with application_name
// "backfill <worker key> " followed by the session's own (set_config
// local, reverted when the transaction ends; cut at 63 bytes, the key
// first), so that pg_locks (the transaction ID the locked row
// names in xmax) and pg_stat_activity lead from a held chunk to its
// worker and its heartbeat. A worker that finds nothing to claim while
// chunks are held by others waits, and terminates (pg_terminate_backend)
// the backend of a holder whose worker's heartbeat is older than
// [Config.StaleAfter]; the check of the heartbeat and the termination are
// one statement.
//
// The token that keeps a fenced-out worker from committing: its
// (lease_key, lease_epoch), checked by the fence under the row lock in the
// transaction that holds the chunk's writes (internal/pgstore/lease.go); and for a
// worker already in that transaction, the row lock: terminating the
// backend rolls that transaction back, and the worker can never commit it.
// A new transaction must claim the chunk again, which only works while the
// chunk is pending (or open) and no one else holds it, and the checkpoint
// (CompleteChunk) updates the row only WHERE its status is still pending,
// staged or open and the run is not abandoned or rolled back.

// Liveness values of [RunLiveness.Liveness] for a running run; a run that
// is not running has its status as its liveness.
const (
	// LivenessRunning: a worker of the run heartbeated within its
	// [Config.StaleAfter].
	LivenessRunning = pgstore.LivenessRunning
	// LivenessStalled: no unfinished worker heartbeated within its
	// StaleAfter, but one did within twice it: a worker is frozen or cut
	// off, and waiting workers fence it.
	LivenessStalled = pgstore.LivenessStalled
	// LivenessDead: the run is running in the manifest but no unfinished
	// worker heartbeated within twice its StaleAfter (or none ever
	// registered): nobody works it. Running the job again resumes it.
	LivenessDead = pgstore.LivenessDead
)
