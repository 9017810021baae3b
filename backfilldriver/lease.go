package backfilldriver

import (
	"context"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/pgbackfill/backfill/backfilltype"
)

// ManifestLeases is implemented by manifests that register the workers of
// a run and lease its chunks across transactions. A Runner requires it
// (NewWithDB refuses a Manifest without it, with an error wrapping
// [backfilltype.ErrUnsupported]): every chunk runs on the leased path.
//
//  1. A call of Run registers a worker (RegisterWorker) and heartbeats
//     from a goroutine of its own (Heartbeat) until it marks the worker
//     finished (FinishWorker).
//  2. Each chunk is leased in a short transaction of its own
//     (LeaseChunk), under the worker's key and a new epoch, and
//     extracted outside any transaction.
//  3. The chunk's transaction begins with the fence (FenceLease): the
//     lease must still be the worker's at that epoch. The fence locks the
//     chunk until the transaction ends; a commit clears the lease, with
//     the chunk's merge and checkpoint.
//  4. A chunk that ends without a commit has its lease released
//     (ReleaseLease), if it is still the worker's.
//
// A lease is live while its worker is unfinished and heartbeated within
// its stale bound (the greater of the worker's registered StaleAfter and
// the asker's), or while it is younger than the asker's StaleAfter. A
// lease that is not live may be taken over by another key, with a higher
// epoch; the fence of the key that held it then fails, and that key's
// transaction must not commit the chunk.
//
// Every method is safe for concurrent use by several goroutines and
// several processes, and returns ctx's error when ctx is done before it
// finished. Times are the manifest's clock (PostgreSQL: the server's
// now()), so the clocks of the workers' hosts do not matter.
type ManifestLeases interface {
	// RegisterWorker records worker w (its Key, ID, BatchID, Job, Host,
	// PID and StaleAfter; the manifest sets its StartedAt and
	// HeartbeatAt to now and its State to "working"), in a transaction
	// of its own. The Runner calls it once per call of Run, before the
	// first lease. It returns an error when w.Key is already registered
	// or w.BatchID is no run of the manifest.
	RegisterWorker(ctx context.Context, db sqlx.ExtContext, w backfilltype.Worker) error
	// Heartbeat sets the HeartbeatAt of worker key to now, unless it is
	// finished, in a transaction of its own. The Runner calls it every
	// Config.HeartbeatInterval from a goroutine of its own while the
	// worker's chunk goroutines lease, fence and release. An unknown or
	// finished key is no error: nothing changes. A lost heartbeat is
	// harmless; a worker that stops heartbeating longer than its stale
	// bound loses its leases to others.
	Heartbeat(ctx context.Context, db sqlx.ExtContext, key string) error
	// FinishWorker marks worker key finished (its HeartbeatAt and
	// FinishedAt now, its State "finished"), in a transaction of its own.
	// The Runner calls it once, when its call of Run returns. A finished
	// worker's leases are live only while younger than the asker's
	// StaleAfter.
	FinishWorker(ctx context.Context, db sqlx.ExtContext, key string) error

	// LeaseChunk leases, under l.Key, the lowest-Seq claimable chunk of
	// run batchID, in a transaction of its own that commits before it
	// returns. A chunk is claimable while the run is running and the
	// chunk is pending, or open and left open by an earlier call of the
	// run ([backfilltype.ChunkOpen]), is not in l.Avoid, is not locked by
	// a chunk transaction (FenceLease, ClaimChunk: it is skipped, not
	// waited for), and its lease is free, not live (by l.StaleAfter), or
	// l.Key's own. The lease's epoch is one more than the chunk's last.
	// It returns the chunk's state, the new epoch and the run's
	// ControlState (its status, last error as reason, knobs), with ok
	// true; ok false when no chunk is claimable.
	//
	// With l.JobConcurrency > 0 it leases only while fewer than that many
	// chunks of the run hold a live lease; otherwise it returns ok false
	// and full true. Concurrent calls on one run do not both take the
	// last place.
	//
	// The Runner calls it before each chunk, one call at a time per call
	// of Run (its goroutines share a worker key and list the chunks the
	// others hold in l.Avoid).
	LeaseChunk(ctx context.Context, db sqlx.ExtContext, batchID int64, l Lease) (cl ChunkLease, ok, full bool, err error)
	// FenceLease is the first statement of the chunk's transaction tx
	// (the Runner's chunk transaction, begun with [DB.Begin]): it checks
	// that chunk seq of run batchID is still leased by l.Key at epoch,
	// that the chunk is pending (or open and left open by an earlier
	// call) and that the run is running or paused (a chunk in flight when
	// the run is paused finishes), and if so locks the chunk until tx
	// ends and clears its lease in tx (so the commit of the chunk's
	// checkpoint ends the lease, and a rollback leaves it to its key).
	// It waits for a lock held by another transaction on the chunk. It
	// returns the chunk's state and the transaction's backend process ID
	// (0 when the manifest has none: the Runner then watches no waits),
	// with ok true.
	//
	// ok is false, with a nil error, when the lease is gone: taken over
	// by another key (this worker was not live), released, or the chunk
	// or the run moved on (done, failed; abandoned, rolled back,
	// cancelled). tx must then not commit the chunk: the Runner rolls it
	// back, records nothing and leases again.
	//
	// l's timeouts (LockTimeout, StmtTimeout) and key are the settings of
	// tx, as far as the manifest has any (backfill.PGManifest: set_config
	// local lock_timeout, statement_timeout 0 until the merge,
	// application_name "backfill <key> " and TCP keepalives bounded by
	// l.StaleAfter).
	FenceLease(ctx context.Context, tx sqlx.ExtContext, batchID int64, seq int, epoch int64, l Lease) (st backfilltype.ChunkState, pid int, ok bool, err error)
	// ReleaseLease clears the lease of chunk seq of run batchID if it is
	// still key's at epoch, in a transaction of its own. A lease taken
	// over meanwhile (another key, or a later epoch) is left alone, and
	// that is no error. The Runner calls it when a leased chunk ends
	// without a commit (a failure, a wait, a rollback, a stop); a release
	// that fails leaves the lease to expire, or to be leased again by
	// key, which LeaseChunk allows.
	ReleaseLease(ctx context.Context, db sqlx.ExtContext, batchID int64, seq int, key string, epoch int64) error

	// Holders lists, in Seq order, the pending or open chunks of run
	// batchID that are in flight for other workers than self ("" for
	// none): locked by a chunk transaction (PID its backend, 0 when the
	// manifest has none; WorkerKey "" when the transaction's worker is
	// unknown), or leased by a live lease (by staleAfter; PID 0). With
	// running, only while the run is running (none otherwise). With
	// fence, it ends, in the same step, the transaction of each holder
	// whose registered worker is stale (finished, or its heartbeat older
	// than the greater of its StaleAfter and staleAfter): that
	// transaction rolls back and its chunk is claimable again; such a
	// holder is reported with Terminated. A leased chunk is never ended:
	// a lease that is not live is taken over by LeaseChunk instead.
	//
	// The Runner calls it when a worker finds nothing to lease, to wait
	// (and log) while others hold chunks, and to fence the stale ones. An
	// error wrapping a permission failure of ending another worker's
	// transaction (backfill.PGManifest: SQLSTATE 42501) makes the Runner
	// call it again without fence.
	Holders(ctx context.Context, db sqlx.ExtContext, batchID int64, self string, staleAfter time.Duration, fence, running bool) ([]ChunkHolder, error)
	// WaitInFlight returns once no pending or open chunk of run batchID is
	// in flight: locked by a chunk transaction, or leased by a live lease
	// of another key than w.Self (by w.StaleAfter). It polls every
	// w.Poll, logs the holders it waits for to w.Log (nil: none) as
	// w.What, and fences the stale ones as Holders does with fence. It
	// returns ctx's error when ctx is done first.
	//
	// It is the barrier after a run stops running (abandoned, paused or
	// failed before a rollback, cancelled): a chunk leased or claimed
	// while the run was running is either in flight (waited for), or
	// refused by its fence or checkpoint.
	WaitInFlight(ctx context.Context, db sqlx.ExtContext, batchID int64, w FenceWait) error
}

// Lease is what a worker leases and fences a chunk with
// ([ManifestLeases.LeaseChunk], [ManifestLeases.FenceLease]).
type Lease struct {
	// Key is the worker's key ([backfilltype.Worker.Key]): the lease's
	// owner, and the tag of the chunk's transaction.
	Key string
	// StaleAfter is the asker's Config.StaleAfter: a lease younger than
	// it, or whose worker heartbeated within it (or within the worker's
	// own bound, if greater), is live. It also bounds the time a dead
	// peer (network cut) goes unnoticed by the server (TCP keepalives,
	// tcp_user_timeout of the chunk's transaction).
	StaleAfter time.Duration
	// LockTimeout is the lock_timeout of the chunk's transaction (the
	// first row of Config.LockRetries; "" keeps the session's);
	// StmtTimeout is the statement_timeout of its merge and what follows
	// ("" keeps the session's).
	LockTimeout, StmtTimeout string
	// Avoid are chunks (Seq) LeaseChunk does not lease now: held by the
	// worker's other goroutines, or pausing after a wait.
	Avoid []int
	// JobConcurrency is Config.JobConcurrency: at most this many live
	// leases in the run (0: no cap).
	JobConcurrency int
}

// ChunkLease is a chunk leased by [ManifestLeases.LeaseChunk].
type ChunkLease struct {
	// State is the chunk as leased.
	State backfilltype.ChunkState
	// Epoch is the lease's epoch: the fence and the release of the lease
	// name it, with the key.
	Epoch int64
	// Control is the run's control state, read with the lease (the read
	// between two chunks).
	Control backfilltype.ControlState
}

// ChunkHolder is a chunk in flight for another worker
// ([ManifestLeases.Holders]).
type ChunkHolder struct {
	// Seq and ChunkID are the chunk's.
	Seq     int    `db:"seq"`
	ChunkID string `db:"chunk_id"`
	// PID is the backend of the transaction that locks the chunk (0 for a
	// lease, or a manifest without backends).
	PID int `db:"pid"`
	// WorkerKey is the holder's worker key ("" when unknown); WorkerID
	// and Host are its registration's (WorkerID may be the transaction's
	// application_name for an unknown worker).
	WorkerKey string `db:"worker_key"`
	WorkerID  string `db:"worker_id"`
	Host      string `db:"host"`
	// OSPID is the worker's process ID on its host (0 when unknown).
	OSPID int `db:"os_pid"`
	// AgeSec is the age of the worker's heartbeat in seconds, -1 when
	// the holder is not a registered worker.
	AgeSec float64 `db:"age_sec"`
	// Stale: the holder's worker is finished, or its heartbeat is older
	// than its stale bound (reported for transaction holders only).
	Stale bool `db:"stale"`
	// Terminated: Holders ended the holder's transaction (fence).
	Terminated bool `db:"terminated"`
}

// FenceWait says how [ManifestLeases.WaitInFlight] waits and fences, and
// where it logs.
type FenceWait struct {
	// Self is the waiting worker's key ("" for none): its own leases are
	// not waited for.
	Self string
	// StaleAfter is the waiter's Config.StaleAfter: the bound by which
	// leases are live and holders stale.
	StaleAfter time.Duration
	// Poll is the time between two looks.
	Poll time.Duration
	// Log receives the holders waited for (nil: discarded).
	Log *slog.Logger
	// What says what waits, for the log.
	What string
}
