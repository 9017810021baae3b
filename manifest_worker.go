package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// Liveness and fencing of the workers of a run (see the package
// documentation, "Many workers and hosts"). Each call of [Runner.Run]
// registers a worker row, heartbeats it every [Config.HeartbeatInterval]
// and marks it finished on return; all times are the server's. A worker
// that finds nothing to claim while others hold chunks waits, and
// terminates the backend of a holder whose heartbeat is older than
// [Config.StaleAfter]. A fenced-out worker can never commit: its token is
// its lease (lease_key, lease_epoch), checked under the chunk's row lock
// in the transaction that holds its writes, or, for a worker inside that
// transaction, the row lock itself. The design note
// docs/design/short-transactions.md explains the mechanism.

// Liveness values of [backfilltype.RunLiveness.Liveness] for a running run;
// a run that is not running has its status as its liveness.
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
