/*
Package backfill reprocesses history into PostgreSQL safely: frozen plans,
chunking on stable boundaries, a durable manifest, idempotent merging by
business key, an exception queue for bad rows, and resume after any crash.

The worst backfill failure is not a crash but a half-finished run with no
reliable record of what succeeded. backfill gives every run a batch ID and
a manifest in the target database, and loads each chunk in one transaction
from staging to checkpoint, so a crash leaves all of a chunk or none of it,
and running the job again resumes where it stopped.

# A job

Host applications write only the [Extractor]: it reads one [Chunk] of the
source and writes its rows to a [RowWriter]. Everything else is declared:

	job := backfill.Job{
		Name:        "orders-2024-restatement", // same name + same plan = resume
		Source:      "erp",                     // lineage
		CodeVersion: "v1.4.2",                  // part of the plan fingerprint
		Chunker:     backfill.Days(start, end, loc),
		Extractor:   myExtractor,
		Target: backfill.Target{
			Table:   "sales.order_lines",
			Key:     []string{"source_system", "order_no", "line_no"},
			Columns: []string{"source_system", "order_no", "line_no", "qty", "amount"},
		},
	}
	r, err := backfill.New(db, &backfill.Config{Concurrency: 2})
	report, err := r.Run(ctx, job)

# Chunks

A [Chunker] turns the scope into an ordered list of chunks that tile it:
half-open intervals [start, end) with no gap and no overlap, each with a
stable ID derived from its bounds. Built-ins: [Hours], [Days] and [Months]
(calendar boundaries in an IANA location; a daylight-saving day is 23 or 25
hours), [Every] (fixed durations), [IntRange] (integer keys) and [List]
(tenants, files).

# One chunk, one transaction

For each chunk the [Runner]:

 1. leases it in the manifest, in a short transaction of its own that
    commits at once: the lowest-Seq claimable chunk that no live worker
    leases, under the call's worker key and a new epoch. Any number of
    workers and processes can run the same job, and the chunk of a worker
    that crashed or froze is leased by another once its lease is no
    longer live ([Config.StaleAfter]);
 2. calls the Extractor outside any transaction; each row is converted to
    its column's type in Go, rows that cannot be stored go to the
    exception queue with the chunk, row number, column, value and reason,
    and the good rows are kept in a spool (in memory within
    [Config.MemoryBudget]: by default up to 6 MiB a chunk and 12 MiB for
    all the Runner's chunks at once, then in a temporary file);
 3. begins the chunk's transaction with the fence, which goes on only
    while the lease is still the worker's at its epoch and locks the
    chunk's row until the transaction ends; a lease taken over meanwhile
    rolls the transaction back, and nothing of the chunk is recorded;
 4. COPYs the spooled rows into a temporary staging table;
 5. merges staging into the target by business key ([Merger]); rows the
    target refuses (another unique constraint, a CHECK, a foreign key, a
    trigger that raises, the btree size limit) go to the exception queue
    with the constraint and PostgreSQL's message, and the rest merges
    ([Config.MaxMergeRefusals]);
 6. checks the accounting identity
    read = inserted + updated + unchanged + rejected + deduplicated;
 7. writes the exception rows and marks the chunk done with its counts,
    which ends its lease;
 8. commits.

From the fence to the commit the chunk is one transaction, so a crash
leaves all of it or none of it; no transaction is open while the source
is read. A chunk that fails or waits rolls back and has its lease
released. The Manifest must lease chunks
([backfilldriver.ManifestLeases]): [PGManifest] does, and so does the
in-memory Manifest of backfilltest, so a test on the fakes runs the
path production runs.

# Least privilege

An administrator creates and migrates the manifest's schema once
(the Migrate method of [PGManifest], or the command "backfill migrate" of
the module cmd/backfill); its Init method then only reads the version, so
the role
that runs jobs needs no DDL privilege. [Runner.Run] checks, before it
creates or resumes a batch, every privilege the job needs (USAGE on the
manifest's schema and DML on its tables, TEMPORARY on the database, USAGE
on the target's schema, SELECT and INSERT on the target, UPDATE where runs
update rows, CREATE for the publish modes that create tables), and
[Runner.Rollback] DELETE (and UPDATE to restore updated rows) before it
changes anything; a missing one is a [*PrivilegeError] listing them all
with the GRANT statements to run. An Upsert by a role without UPDATE runs
insert-only. See the README's "Deploying".

Three roles share a manifest. The owner migrates it ("backfill migrate")
and owns its tables and its control functions (pause, resume, cancel,
set_knob), which run as the owner (SECURITY DEFINER) and which PUBLIC may
not execute. A loader, granted with "backfill migrate --grant ROLE"
([PGManifest.Grants]), runs jobs: DML on the manifest's tables but the
audit log (events) and schema_migrations, which it only reads; it
appends the library's events through the function record_event and
[Runner.PauseOnSignal] pauses through library_control (actor "backfill").
An operator, made with "backfill migrate --grant-operator ROLE"
([PGManifest.OperatorGrants]: created NOLOGIN when missing; people are
members of it), executes the control functions and reads the manifest.
[Runner.Pause], [Runner.Cancel] and [Runner.SetKnob] by a role that is no
operator return an error wrapping [ErrPrivilege] naming the role, the
function and that fix; [Runner.Status] by a role that may not read the
manifest returns a [*PrivilegeError] of [ActionRead] naming USAGE and
SELECT and the same fix, and [PGManifest] CheckAccess checks an action's
privileges ([ActionRun], [ActionRead], [ActionControl]). Each event
records the session's database role (Event.DBRole) beside the actor
given. The control functions refuse an actor over 200 characters, a
reason over 2000, a job name over 1000, a knob name over 200 and a knob
value over 100, with an error naming the cap and the length
([ErrInvalidConfig] from Go, checked before the call); record_event
refuses an actor or kind over 200 characters, a job name over 1000 and a
detail over 65536 characters of jsonb text, and the library fits its own
events within these caps.

# Isolation levels and conflicts

Every transaction the library begins is READ COMMITTED, whatever the
database's default_transaction_isolation: each one takes a lock first (an
advisory lock on the job, the schema or the view; a row lock with FOR
UPDATE) and then must see what the holder before it committed, which a
REPEATABLE READ or SERIALIZABLE snapshot taken before the lock would hide.
So the manifest's Init and the start of a run are safe when any number of
processes start one job at once under any default, and they converge on one
run. A transaction outside a chunk (Init, starting, finishing and pausing a
run, recording a failed attempt, an event, validations or gate evidence,
accepting a gate, resuming, rollback and publish steps) that fails with
serialization_failure (40001) or deadlock_detected (40P01) is run again, up
to 8 times with a jittered backoff of at most 320 ms; a chunk's transaction
is retried as a chunk attempt ([IsRetryable], [Config.MaxAttempts]; its
connection faults are not attempts, see Transient faults). Its
reads outside a chunk (the manifest's Chunks, Run, Events, the catalog
reads of the PostgreSQL merger's Prepare, ...) run in READ COMMITTED
transactions of their own too, retried the same way.

# Poolers

The library works behind a transaction pooler, such as PgBouncer with
pool_mode = transaction, with an ordinary connection string. No statement
depends on the server session across transactions: every statement with
bind parameters runs inside a transaction (lib/pq sends one outside a
transaction in two round trips, between which a pooler may switch server
connections), settings are SET LOCAL (set_config with is_local), advisory
locks are transaction locks (a rollback takes the target's merge lock in
each of its transactions and checks for conflicts again in each), staging
tables are created in the chunk's transaction when missing and emptied at
its commit, and no named prepared statement is used. A pooler in
statement mode refuses transactions: the error of the first transaction
says to set pool_mode = transaction. Size the pooler's
pool (default_pool_size) for [Config.Concurrency] times the number of
workers plus one: each chunk holds a server connection for its
transaction, from the fence to the commit, and none while its extractor
runs; the leases, heartbeats and other manifest transactions are short.

# Many workers and hosts

Any number of processes on any number of hosts run one job by calling
[Runner.Run] (or [Work], which returns an exit code) with the same job:
the first creates the run, the others resume it, each claims chunks no
other holds. The run's row is not locked by chunks, so a worker joining
a running job, or finishing its share, never waits on it behind chunks
in flight.

Short transactions. No transaction of the library is open on the target
while the extractor reads the source. A worker leases a chunk in a short
transaction of its own (its worker key in the chunk's lease_key,
lease_epoch incremented, committed), extracts it outside any transaction
into a spool (rows converted and checked as always, kept in memory up to
shares of Config.MemoryBudget, by default 6 MiB a chunk and 12 MiB for
all the Runner's chunks at once, then in a temporary
file removed when the chunk ends), then opens
the chunk's transaction: the fence (the chunk's row locked and its lease
cleared WHERE lease_key and lease_epoch are still its own, the chunk
claimable and the run running), staging from the
spool (COPY; a value PostgreSQL refuses is isolated by replaying the
spool, not by extracting again), merge, validation, checkpoint, commit.
The chunk's transaction lasts as long as staging, merge and checkpoint.
By default each worker leases and extracts its next chunk while its
current chunk's transaction runs, so the client converts rows while the
server merges and commits; it still runs one chunk transaction at a
time, writes its chunks in the order it leased them and never runs two
Extract calls at once. Config.SerialExtract turns this off; a call with
Config.JobConcurrency, or whose pool's MaxOpenConns is below
2×Concurrency+2, extracts serially and says so once in the log.
A lease is live while its worker is unfinished and heartbeats within its
StaleAfter (or was taken less than the claimer's StaleAfter ago); a
claim takes a chunk whose lease is not live over, incrementing its
epoch. A chunk leased by a live worker is in flight, like a chunk whose
row a transaction holds. A worker killed while it extracts leaves its
lease to be taken over after StaleAfter (with a row lock, its connection
closing released it at once): the price of not holding a transaction.
A worker that could not register leases under its key all the same; its
leases are then live only while younger than StaleAfter.

Liveness. Each call registers in the manifest's workers table (a random
worker key, [Config.WorkerID], host, pid, its stale bound) and refreshes
heartbeat_at every [Config.HeartbeatInterval] (default 5 s) from a
goroutine of its own, then marks itself finished. The run_liveness view
([backfilldriver.ManifestWorkers.RunLiveness],
[backfilldriver.ManifestWorkers.Workers]) gives each run's liveness:
running (a worker heartbeated within its StaleAfter), stalled (the freshest
unfinished worker is past StaleAfter but within twice it), dead (no
unfinished worker within twice StaleAfter, or none: nobody works the run;
run the job again to resume it); a run that is not running has its status.
Times are the server's, so host clocks do not matter.

Fencing. A worker that finds nothing to claim while chunks are held by
other workers does not return: it waits, polling every
HeartbeatInterval (at most every second), and logs each held chunk with
its holder (worker, host, backend pid, heartbeat age) and how long it has
waited. The holder is the lease's worker, or, for a chunk in its
transaction, is found through the locked row's transaction
(pg_locks) and the application_name "backfill <worker key> " that the
fence statement puts before the session's own for the chunk's
transaction. A lease whose worker stopped heartbeating is taken over by
the next claim. A transaction holder whose worker's
heartbeat is older than [Config.StaleAfter] (default 30 s) is fenced: its
backend is terminated with pg_terminate_backend, in the same statement
that checks the heartbeat, which rolls its chunk back; the waiting worker
then claims it. The advisory locks a chunk's merge waits for (its key
locks; a rollback's whole-target lock likewise) are taken in steps of
that poll interval, each a lock_timeout in a savepoint that keeps the
chunk's staged rows; after each step the worker logs the holders of the
conflicting lock (found in pg_locks, with the same application_name)
and fences a stale one with the same statement, so a worker frozen
between its merge and its commit stops nobody for longer. A holder
that is a live worker is waited for (its merge ends on its own); a
session that is no worker is a lock wait like any other, bounded by the
try's lock_timeout and retried by [Config.LockRetries]. A healthy worker
therefore waits behind a frozen one at
most about StaleAfter + HeartbeatInterval + 1 s (36 s by default), within
the documented bound of one minute; a slow worker whose heartbeats go on
is never fenced. Terminating another role's backend needs the role
pg_signal_backend (or all workers running as one role); without it the
waiting worker logs the GRANT needed and waits on.

The server bounds a cut-off worker too: each chunk's transaction sets,
locally, TCP keepalives (idle StaleAfter/3, interval StaleAfter/9, 3
probes) and tcp_user_timeout = StaleAfter, so that a network split ends
the backend within the bound even with no worker waiting. The chunk's
transaction sets no idle_in_transaction_session_timeout: it is idle while
validators run in the process, which may be slow and healthy. The
library's short manifest transactions (starting, finishing, pausing a
run, recording a failure) set idle_in_transaction_session_timeout = 10 s
locally, so a worker frozen inside one holds the run's row at most that
long. Run-row locks are FOR NO KEY UPDATE, which never blocks a chunk's
transaction (its rows reference the run's row with FOR KEY SHARE).
It also sets statement_timeout 0 for the COPY (which stays open while
the spool is replayed into it), so that time is not charged to a role's
or database's statement_timeout; the merge's statements run under
[Config.StatementTimeout] or the caller's value again (see "Beside
production").

The token. A fenced-out worker can never commit its chunk. Its token is
(lease_key, lease_epoch), checked by the fence under the chunk's row
lock in the transaction that also holds the chunk's writes, exceptions
and checkpoint: a worker whose lease was taken over (it froze or was cut
off longer than StaleAfter while extracting) finds no row, rolls back
and claims again; a taker that finds the row locked by a stale worker's
transaction skips it, and the waiting workers terminate that backend,
which rolls it back; a later attempt must lease the chunk again (only
while it is pending and unheld). The checkpoint updates the chunk's row
only while it is pending (or staged, open) and the run is not abandoned
or rolled back. A
worker of an abandoned run never writes over a newer run: [Job.NewRun]
commits the abandon first, then waits for the abandoned run's chunks in
flight (fencing stale holders, logging the wait) before it creates the
new run; a rollback of a failed or paused run waits for them likewise.

Restarts. A server restart or a dropped connection (class 08, 53300,
57P01, 57P02, 57P03, a bad connection, EOF, connection refused) that
ends a chunk's transaction is a fault, not a failed attempt (see
Transient faults): the chunk is tried again once the server is back,
under the same attempt; registering, claiming, recording and the run's
end are retried with backoff likewise. Both for up to twice StaleAfter.
The run ends completed when all chunks are done, failed with last_error
when a chunk's attempts are exhausted, and a call that returns early
(cancelled, or faults past their bound) leaves it running for the next
call, its liveness dead.

Exit codes. [Work] returns [ExitDone] (0: completed, by this worker or
others), [ExitFailed] (1: failed; last_error says why; do not restart
blindly), [ExitCancelled] (3: an operator cancelled the run; do not
restart until it is resumed), [ExitUsage] (64: bad job or configuration)
or [ExitTempFail] (75: not finished: the context cancelled, chunks
open, database away, or abandoned for a newer run; restart later to
resume). A paused run does not end Work: it waits, a live worker of the
run, and goes on when the run is resumed; so does [Runner.Run] by
default (except on its own [Runner.PauseOnSignal]; [Config.ReturnOnPause]
makes it return instead).

Control. The manifest's SQL functions pause, resume and cancel a run and
set its live knobs, from psql or from Go ([Runner.Pause],
[Runner.Cancel], [Runner.SetKnob], [Runner.Resume]); every worker of
every process reads its run's control state every
[Config.ThrottleInterval], after each chunk, and on the notification
([Config.ListenURL]). Knobs belong to the run: set on a paused,
cancelled or failed run, they apply once it is resumed or run again. See
[backfilltype.ControlState] and the README's "Operating".

# Beside production

Each chunk's transaction and each short manifest transaction set,
locally (set_config(..., true): they end with the transaction),
lock_timeout and statement_timeout. lock_timeout is the try's row of
[Config.LockRetries], at most [Config.LockTimeout] (default 2 s): an
application session queued behind a lock the library waits for waits
that long at most. statement_timeout ([Config.StatementTimeout]; by
default the session's, role's or database's) bounds the merge, the
validators and the checkpoint, never the extractor's time (it runs
outside any transaction). Both are set by the fence statement, with no
extra round trip. The merge's key locks (advisory locks that order merges of the same
keys) wait for a live worker's merge beyond lock_timeout, in steps that
fence a stale holder (see Fencing); a holder that is no worker (an
operator's session) holds them for the try's lock_timeout at most.

A try that ends with a lock timeout (55P03), a deadlock (40P01), a
serialization failure (40001) or a statement timeout (57014, while the
context is not done) is a wait, not a failure: the transaction rolls back,
the worker logs the wait ("backfill: chunk waited", with seq, chunk,
attempt, try, sqlstate, lock_timeout, statement_timeout, waited and
blockers) and records it in the manifest's waits table
([backfilldriver.ManifestWaits], which [PGManifest] implements), sleeps the row's
Sleep (jittered ±25 %; after a serialization failure or a deadlock, which
wait on nobody, 20 ms doubled on each try, at most the row's Sleep) while
this call's other workers skip the chunk, and tries again with the next
row. [DefaultLockRetries] is 100 ms/1 s,
200 ms/1 s, 500 ms/2 s, 1 s/5 s, 2 s/10 s, 2 s/10 s, 2 s/20 s, 2 s
(lock_timeout/sleep for the default LockTimeout): about a minute of
patience per attempt. Waits do not count toward [Config.MaxAttempts]; a
wait on the last row ends the attempt as failed, and the next attempt
starts the table again. Rows are counted per call of Run and per chunk:
another process starts a chunk at the first row.

The blockers: while the chunk's merge, validation and checkpoint run, a
watcher on another connection of the pool reads, after half the try's
timeout, what the chunk's backend does (pg_stat_activity by its pid;
pg_locks.waitstart) and, while it waits for a lock, the sessions
pg_blocking_pids names: their pid, application_name, state, wait event
and query ([backfilltype.Blocker]). It must look while the backend waits; the
blockers are gone once the try timed out.

A wait is recorded in a short transaction of its own after the chunk's
rollback: the record is append-only, and a crash between the rollback
and the record loses that one record (the log line says it), nothing
else.

A retried try leases and extracts its chunk again (the spool is not kept
across tries). No transaction is open while the source is read, also
with [Config.JobConcurrency], which caps the run's live leases.

# Transient faults

The manifest's own transactions (the start-up reads, the start and end
of a run, leases, heartbeats, a worker's registration, the records of
failures, waits and events, the reads of status and progress) are
retried, as a whole, on the transient faults of the connection or the
server: class 08 (a lost connection, also driver: bad connection and
an unexpected EOF), 53300 (max_connections or a role's CONNECTION LIMIT
used up by other clients), 57P01 to 57P03 (a backend terminated, a
server shutting down or starting), and, as before, 40001 and 40P01. The
sleeps double from 100 ms to at most 5 s (jittered ±25 %); the bound is
2 × [Config.StaleAfter] (one minute with the defaults) from the first
fault. Each fault is logged at WARN ("backfill: a manifest transaction
hit a transient fault; retrying after a pause", with what, batch_id,
sqlstate, try, sleep and the error), and the success after faults at
INFO. Past the bound the call returns an error that names what the
transaction did, says how long it tried, and wraps the last fault:
[IsRetryable] reports it, and [Work] exits with [ExitTempFail].

A COMMIT cut mid-flight is ambiguous (the server may have committed), so
each retried transaction is safe to run twice: the start of a run looks
for the batch it created before creating one (a batch ID is never
reused), the end of a run finds the run already completed or failed, a
worker's registration keeps the row of its own key, a lease taken twice
is the same worker's (its own key takes its chunk back), and a chunk's
transaction is fenced by its lease. A record of an event or a wait may
then appear twice; a chunk's failure may count one attempt more.

A chunk's transaction that ends on one of these faults (not 40001 or
40P01, which are waits, see Beside production; never an error of the
extraction, which runs outside it) rolls back and is not a failed
attempt: nothing is recorded against the chunk, this call's claims skip
it for the same doubling, jittered sleep, and it is tried again under
the same attempt number; it does not count toward
[Config.MaxAttempts]. Each fault is logged at WARN ("backfill: chunk's
connection to the server was lost; rolled back, retrying after a pause
(not counted toward MaxAttempts)", with seq, chunk, attempt, sqlstate,
fault, faulty_for, sleep and the error, which says the connection was
lost and names what the statement was doing, never its SQL). A worker
fenced by another (its backend terminated: 57P01) leaves the chunk to
its new holder the same way and claims another. The bound is the
manifest's, 2 × [Config.StaleAfter] from the chunk's first fault in the
call: past it the call ends with an error that [IsRetryable] reports
(wrapping the last fault), the run is not failed, [Work] exits with
[ExitTempFail], and the next call resumes it. A COMMIT cut mid-flight
may have committed: the chunk is then done, and the next claim skips
it.

Lock waits of the manifest's transactions (an operator's LOCK TABLE on
backfill.chunks or backfill.runs) are bounded like a chunk's: each
statement waits at most [Config.LockTimeout], the transaction is tried
again with the sleeps of [Config.LockRetries], and each wait is logged
("backfill: a transaction of the library waited", with what, batch_id,
sqlstate, lock_timeout, sleep and blockers: the sessions holding strong
locks, with the table and mode, such as "AccessExclusiveLock on
backfill.chunks"). Reads of the manifest wait so too. Once the table is
used up, the error names the blockers and stays retryable (55P03).

A manifest schema dropped (or never created) gives an error that names
the schema, says it is missing and to run backfill migrate, and wraps
[ErrSchemaMissing] (which errors.Is reports as [ErrSchemaBehind] too);
messages about the end of a run name its batch.

# Throttles

A backfill runs beside production. [Config.Throttles] lists signals that
hold the run: before each claim a worker waits while any
[backfillthrottle.Throttle] holds (chunks in progress finish; a claim made
while a hold began rolls back). Each call of [Runner.Run] reads every
signal every [Config.ThrottleInterval] (default 500 ms) and before its
first claim, so a raised signal holds every worker of every process within
one interval: each process reads the signals itself (they are server-wide
reads that every process sees alike; no decision travels through the
manifest, and no process is a single point of failure).

Hysteresis: a throttle holds when a reading is at or above High and
releases only when a reading is below Low and the hold has lasted
MinHold, so a value sitting at a threshold causes at most one hold and
one release per MinHold. A reading at or above Critical pauses the run
(status paused, the reason naming the signal, value and level): every
worker of every process stops claiming and waits (Run returns an error
wrapping [ErrRunPaused] instead with [Config.ReturnOnPause]), and a
person continues it with the SQL function resume,
"backfill resume" or [Runner.Resume]. Each
check is logged at debug level; each hold (warn), release (info) and
critical pause (error) with signal, value and watermarks.

Built-in signals: [backfillthrottle.ReplicaLagSignal] (seconds, max
replay_lag of pg_stat_replication), [backfillthrottle.WALRateSignal]
(bytes/s of WAL generated), [backfillthrottle.ArchiveBacklogSignal] (WAL
segments not yet archived), [backfillthrottle.AutovacuumSignal] (autovacuum
workers on the target), [backfillthrottle.LockWaitersSignal] (sessions
waiting on locks held by the run's workers),
[backfillthrottle.ProbeLatencySignal] (p95 or p99 in ms of a probe query
the library runs every interval, over a sliding window),
[backfillthrottle.SQLSignal] (any query returning a number or a boolean)
and schedule windows ([backfillthrottle.ParseSchedule], [backfillthrottle.ScheduleThrottle]:
"Mon-Fri 22:00-06:00 Europe/Berlin", windows crossing midnight, daylight
saving time by the zone's rules). A [backfillthrottle.Signal] is a small
interface: any Go code can be one.

A signal that implements [backfillthrottle.Observer] says when it guards
nothing (a replica lag signal on a server with no replica reads 0
forever): each call of [Runner.Run] asks it when it starts and every
[backfillthrottle.ObserveInterval], logs a WARN naming the signal and why
when the answer is new, records it in the audit trail
([backfilltype.EventSignalInert]) and [Status] lists it
(ThrottleWarnings; "backfill status" shows it) until a call finds it
observing again.

Caps for the whole job, whatever number of processes run it:
[Config.RowsPerSecond] (each call takes the cap divided by the run's live
workers, re-read every interval; a token bucket of golang.org/x/time/rate
charged with each chunk's rows) and [Config.JobConcurrency] (a chunk is
leased only while fewer than N chunks of the run hold a live lease,
counted under a transaction-level advisory lock of the run; a lease lasts
until its chunk's transaction commits, and a dead worker's stops counting
once it is no longer live; a worker that finds N live leases waits and
tries again). The rate is divided rather than drawn from a shared bucket row
so that no manifest row is written per chunk by every process.

A throttle with [backfillthrottle.Throttle.Adapt] is proportional instead:
it cuts the call's rows per second by half at a reading at or above High
(once per MinHold), gives back 5 % of the ceiling per second below Low, and
never holds; the waits the cut rate causes are its throttle periods.

Every hold is a row of the manifest's throttle_periods (batch, worker key,
signal, reason, value, watermarks, start, end); rate-cap waits of an
interval or more too (signal [RateSignalName]).
[backfilldriver.ManifestThrottle.ThrottlePeriods] reads them and
[Runner.TimeSplit] splits a run's time into working, throttled by signal,
paused and idle (no live worker), as [Status] and the report do.

# Progress

[Runner.Status] (and [Runner.StatusOf], the Status and JobStatus methods
of [PGManifest], the
run_progress and chunks_in_flight views) read a run's progress from the
manifest, from any process: chunks by status, rows by outcome, chunks in
flight, exceptions by reason, liveness, the time split (working,
throttled, paused, idle) and an ETA from the remaining planned work and
the rate the run has under the knobs in force now, or, for a run that is
not working (paused, cancelled, failed, dead, held by a throttle), what
it waits for ([Status]). The checkpoint records what it needs
(rows processed, reads, the server's checkpoint time) in the chunk's
transaction. A [Config.Hooks] that implements [ProgressHooks] gets failed
attempts and progress snapshots that count the work of earlier calls and
of other processes.

# Idempotency

The PostgreSQL merge (the default [Merger]) updates only rows whose content
differs (IS DISTINCT FROM, NULL-safe) and inserts only keys that are
absent, so replaying a chunk rewrites, locks and WAL-logs nothing.
Duplicate business keys inside one chunk are resolved before the merge by
[DuplicatePolicy] and counted as deduplicated; the target must have a
unique index on the key ([ErrNoUniqueKey] otherwise).

A replay of an eligible job (by default; see [Job.SkipUnchanged] and
[Job.MergeEveryChunk]) compares fingerprints instead of staging and
merging every row: the chunk's rows are
extracted (hashed as written, or into a spool), and when their multiset
hash and that of the target rows within the chunk's [Job.ChunkColumn]
bounds equal what the chunk's last load recorded with its checkpoint, the
chunk is checkpointed unchanged without staging or merging; otherwise it
is staged and merged as always (a chunk that was only hashed is extracted
a second time for that). See [Job.SkipUnchanged] for the jobs it applies to and
what a skipped chunk records.

# Identity first: merge modes

Decide which columns identify a record, which may change, and which side
wins a disagreement before choosing how to write. [backfilltype.Target.Mode] says it:

  - [Upsert] (default), mutable master data: update by a stable business
    key (composite keys are the norm), insert absent keys.
    [backfilltype.Target.Conflict] decides who wins: [SourceWins] (default),
    [TargetWins] (insert missing only) or [NewerVersionWins], which compares
    [backfilltype.Target.Version] (a source version or modification time) and breaks
    ties by content, so versions arriving out of order give the same final
    state as in order.
  - [AppendOnly], immutable events with a unique event ID: a replay
    resolves to the existing event; the same ID with different content is
    never overwritten and never dropped: it goes to the exception queue
    with the differing columns named.
  - [History], versioned history (SCD type 2): one row per version,
    identified by Key plus valid_from, with half-open intervals
    [valid_from, valid_to) and NULL valid_to on the current version. Late
    versions are inserted at their place, splitting the interval they fall
    into; intervals per key never overlap and leave no gap (checked after
    every merge; a violation fails the chunk with [ErrHistoryIntervals]).
    An identical replay adds no version; the same (key, valid_from) with
    other content corrects that version in place. A key's versions are
    closed before new ones are inserted, so a single-open-version index,
    UNIQUE (key) WHERE valid_to IS NULL, is supported.
  - [Keyless], legacy files without a good key: [backfilltype.Target.Derive] rules
    ([KeyRule] of composable normalizers, [Normalizer]: [Trim], [CollapseSpace],
    [NFC], [NFKC], [CaseFold], [RemovePunctuation]) derive the key. Rows
    whose derived keys collide with different content all go to the
    exception queue; identical ones are deduplicated.

A NULL in a key column never becomes a silent duplicate: the row is
rejected ("missing key column"), unless a Keyless rule opts into
[backfilltype.KeyRule.NullAsEmpty]. A row hash ([backfilltype.Target.HashColumn]) may detect changed
content; it never identifies a row. Its input is unambiguous (NULL markers,
length prefixes) and canonical: equal hashes mean the same content by the
rule of "Equality" below.

Every mode is idempotent: merging the same chunks again, in any order,
any number of times, yields the same table (a property test of the
conformance suite, for the PostgreSQL merger and the fakes alike; for
SourceWins this holds when chunks do not share keys).

# Equality

One rule decides whether a staged row and a target row are the same row
and whether they hold the same content, wherever the library compares
rows: the merge's lookups by key, its deduplication of a chunk's repeated
keys and its change detection, [backfilltype.Target.HashColumn], the
fingerprints of the checks and of [Job.SkipUnchanged], every built-in
check, and rollback's lookups by key.

Values are compared as the target column's type: each staged value is
first read into the column's type (staging has the target's types and
collations). Spellings that the type reads into the same stored value are
the same value: a timestamptz in any zone, a uuid in any case, bool 't' and
'yes', integer '007' and 7, jsonb with other whitespace, key order or
repeated keys, interval '1 day' and 'P1D', char(n) with or without
trailing spaces.

Same row: the identity (Key, plus ValidFrom in [History]) is equal by each
column's own equality under its collation, the equality of the target's
unique index. numeric 1.0 and 1.00 are one key, and so are 'abc' and
'ABC' under a case-insensitive collation or in a citext column. A replay
that spells a key otherwise finds the row its load inserted; the target
keeps the key as it was first stored.

Same content: every compared column holds the same stored value, byte for
byte. Where a type's equality is looser than what it stores, the stored
form decides: numeric 1.5 and 1.50 differ (an unconstrained numeric stores
the scale; numeric(p,s) stores every value at scale s, so there they are
one value), and so do float -0 and 0, interval '1 day' and '24 hours',
jsonb {"a": 1.0} and {"a": 1}, texts that differ in case under a
case-insensitive collation, and json as written. The merge updates a row
whose stored content changed, so the checks then find the target equal to
staging; a replay of the same stored values changes nothing.

The hash column follows the rule: it hashes the canonical text of each
stored value, so a numeric respelled with its scale (1.50 for 15.0e-1)
hashes alike and one with another scale does not. Columns whose text the
row writer passes to PostgreSQL's own input (interval, time, jsonb,
arrays, enums, inet and the other types it does not convert) are left out
of the hash and compared beside it. Fingerprints may be stricter than the rule, never looser: a
key or value spelled otherwise than at the last load may count as
changed, which costs the exact comparison or the merge, never a wrong
verdict. [DuplicateKeys] and [ReferentialIntegrity] group and match
candidate and foreign keys by equality, as a unique index and a foreign
key do. [Aggregates] groups a Dimension that is content by its stored
value, and one that is a key column by the key the target row stores: a
staged row counts in the group of the target row it merged into, however
its key was spelled.

# Time

Chunks are half-open intervals in a declared zone; [Job.ChunkColumn]
rejects rows an extractor wrote outside their chunk ("outside chunk"),
[Job.Zone] reads wall-clock values (a time.Time in a timestamp column,
whatever wrapper delivers it), a Go time.Time is truncated to microseconds
and time text is rounded to microseconds as PostgreSQL rounds it. Event
time, source modification time and ingestion time are distinct
([backfilltype.Target.EventTime], [backfilltype.Target.ModifiedAt], [backfilltype.Target.IngestedAt]).
[Job.Watermark] records a source high-water mark per run and
[Runner.Handoff] rescans from it, minus a lookback, before live ingestion
takes over.

A time chunk that ends after the horizon (the run's watermark, or the
moment it is read) is still open: rows can still arrive in it. It is
loaded but checkpointed as [ChunkOpen], not done; each later call of the
run reads it again (its counts and exceptions then describe the chunk as
it stands), the run stays running until every chunk has closed, and Run
returns an error wrapping [ErrChunksOpen] naming the open chunks. A scope
that reaches into the future, and a date-typed ChunkColumn under a
watermark, are warned about ([Report.Warnings]); publish modes that cannot
read a chunk twice refuse such scopes with [ErrInvalidScope].

# Quality gates

[Job.Validators] check each chunk after its merge, inside its transaction
([Validator]; PostgreSQL checks [DuplicateKeys], [Completeness],
[ReferentialIntegrity], [Aggregates], [ReplayChangesNothing], [Sample],
[CheckExceptionRate]). Their evidence is appended to the manifest. A
failed check of [SeverityError] rolls the chunk back and pauses the run
until [Runner.Resume] records who resumed it and why. [Completeness],
[Aggregates] and [ReplayChangesNothing] first compare fingerprints of the
staged and the target rows (a row count and a sum of row hashes, one scan
per side, computed once per chunk) and run their exact joins only when the
fingerprints differ; set Exact on a check to always run them.

# Publishing

By default each chunk is visible when its transaction commits; the view
backfill.completed_batches lets reports keep only rows of completed
batches. With [PublishVersionedView] a run loads its own version of the
target table and [Job.Publish]'s view switches to it in one transaction at
the end, keeping the previous version for [Runner.Rollback]. The switch
waits for readers of the view at most [Publish.LockTimeout] per try; a
publish blocked on every try ([ErrPublishBlocked]) is recorded (a
publish_blocked event, the run's last_error, and the batch stays out of
backfill.completed_batches) until a later Run publishes it. Its scope must
end before now (or the watermark): a chunk that could still change would
keep the run from ever being published ([ErrInvalidScope]). With
[PublishPartitionSwap] each chunk's partition is rebuilt beside the old one
and swapped in within the chunk's transaction.

# Lineage and rollback

With [Lineage] columns on the target (bigint backfill_inserted_by and
backfill_updated_by by default), every row says which batch inserted it and
which last changed it, and the default [Job.Rollback] is
[RollbackUndoLog]: each chunk's transaction logs the prior images of the
rows it updated (and SCD2 intervals it closed); the rows it inserted are
found again by their lineage.
[Runner.Rollback] withdraws a batch or one chunk in reverse commit order
(at Concurrency > 1 chunks commit in any order), in transactions of whole chunks (a whole batch in slices of at most 200 chunks and 100,000 restored rows), each with its own checkpoint, refuses rows a later batch
still applied changed or delivered unchanged unless forced (listing each
row's key and that batch in [RollbackReport.ConflictRows], and naming
those batches, newest first, in [RollbackReport.ConflictBatches]: rolled
back first, in that order, they let this rollback restore the rows
without force), previews without writing (its counts leave the
conflicting rows out unless forced), and records who, why and the counts. Without lineage, a
job must accept [RollbackNone] explicitly. [Runner.RollbackBatch] does the
same by batch ID alone, without the job's code, from the plan the manifest
recorded ([PlanJob]); the backfill command's rollback uses it.

Lineage names only the batch that last changed a row: a row a later batch
delivered unchanged still names the earlier one. Each chunk that delivers
unchanged rows that another batch last wrote therefore records, in the
manifest's delivered table and in its own transaction, one summary per
such batch: how many rows, and the least and greatest identity among
them. Not a row per delivered row: a replay of an unchanged range writes
one small row per chunk. A rollback treats the batch's rows within the
bounds of a still-done delivering chunk as delivered by it. That is exact
about which batches delivered rows, and conservative between the bounds:
a row there that the later batch did not deliver is listed too, never
removed silently. Rolling back the later batch first removes the
conflict.

# Plans and resume

[Runner.Run] freezes the job into a [Plan]: scope, chunk IDs, target,
columns and code version, with a SHA-256 fingerprint. Running the same job
name again with the same plan resumes the incomplete run and never
extracts a completed chunk again; a completed run is not repeated. A
changed plan is refused with [ErrPlanChanged] naming what changed, unless
[Job.NewRun] asks for a new batch.

# Blueprints and approvals

[Runner.Blueprint] returns the plan a run of a job would freeze as a
document for reviewers, writing nothing: scope and chunking, the modules
and their jobs with target, key, columns, identity mode, validators and
thresholds, publish mode, rollback mechanism and what it restores, the
Runner's limits, the approval policy, and the changes since the job's
previous plan ([backfilltype.BlueprintDiff]). Run records each run's
blueprint in the audit log; "backfill plan" prints it. A [Job.Approval]
policy starts each new run [RunAwaitingApproval]: nothing is leased or
written until [Runner.Approve] (the SQL function approve, "backfill
approve") has recorded the approvals of the run's fingerprint the policy
requires, by distinct names and database roles; Run waits meanwhile (it
returns [ErrAwaitingApproval] with [Config.ReturnOnPause]).
A refused approval ([ErrApprovalRefused]: stale fingerprint, the author,
the same approver twice) records nothing. Every decision about a run is
an event of the append-only audit log, which
[backfilltype.ReplayControl] replays into the run's status, knobs,
approvals and module flags.

# Graphs of modules

A [Graph] is a backfill made of [Module]s (each one or more jobs) with
dependencies, priorities, classes (essential or deferrable) and flags,
frozen into one plan and fingerprint. [Runner.RunGraph] refuses a cycle,
an unknown dependency, duplicate names, a job in two modules or an empty
module before writing anything, and runs each chunk of a module after the
overlapping chunks of its parents are committed, on [Runner.RunChunk]'s
path; a failed, paused or disabled module holds only its descendants
([ErrGraphIncomplete]), and under a throttle's hold deferrable modules
park. [Runner.SetModuleEnabled] switches a module's flag as a recorded
plan change; [Runner.GraphBlueprint], [Runner.GraphStatus] and
[Runner.RollbackModule] (which cascades to dependents) complete it.

# The manifest

[PGManifest] keeps runs, chunks, the exception queue and an audit log of
events in its own schema (default "backfill"), created by versioned
migrations that are safe to run concurrently. Query it directly:

	SELECT seq, chunk_id, status, rows_read, rows_inserted, rows_updated,
	       rows_unchanged, rows_rejected, rows_deduplicated
	FROM backfill.chunks WHERE batch_id = 1 ORDER BY seq;
	SELECT chunk_id, row_number, column_name, value, reason, raw
	FROM backfill.exceptions WHERE batch_id = 1;

A CHECK constraint on backfill.chunks enforces the accounting identity.

[LoadRunReport] gathers what the manifest knows of one run into a
[RunReport]: the plan, the run's totals, its chunks in at most 512
buckets in plan order (rows, rejects, durations, rates), its notable
chunks (the slowest, the failed, those with the most rejects, those in
flight), the chunks by worker, the distribution of chunk durations, the
split of the run's time into working, throttled and paused, the waits of
chunks, exceptions by reason and column with examples, validation
evidence and the audit trail, in a bounded number of rows whatever the
number of chunks or exceptions. It needs only the database, not the job's
code; its JSON form is stable, and package contrib/report renders it as
one self-contained HTML file.

# Testing pipelines

Package backfilltest has in-memory fakes of [Manifest], [Merger] and [DB]
that pass the same conformance suites as the PostgreSQL implementations,
so a pipeline's extractor can be tested without a database:

	m := backfilltest.NewMerger()
	m.AddTable("orders", []string{"order_no"}, "order_no", "amount")
	r, _ := backfill.NewWithDB(backfilltest.NewDB(), &backfill.Config{
		Manifest: backfilltest.NewManifest(), Merger: m,
	})

The fakes run the per-chunk and at-end publish modes ([PublishAtEnd]),
validators of your own ([ValidatorFunc]) and [CheckExceptionRate], quality
gates, pause and resume, and keep an undo log: a fake target that
declares the lineage columns (backfill_inserted_by, backfill_updated_by,
bigint) rolls back with [Runner.Rollback] too (not a [History] target).
What they lack is refused before any batch is created, with
[ErrUnsupported] naming the check or the optional interface: refused
values isolated while staging ([backfilldriver.StagingIsolator]), the
other built-in checks, which read the staging table with SQL
([backfilldriver.TableStager]), and the modes that need PostgreSQL DDL
(partition swap, versioned view).

# Capabilities

Besides [Manifest] and [Merger], a Runner uses optional interfaces when
their implementations have them: [backfilldriver.ManifestAudit],
[backfilldriver.ManifestValidations], [backfilldriver.ManifestGates],
[backfilldriver.ManifestUndoLog], [backfilldriver.ManifestStaging],
[backfilldriver.ManifestWaits], [backfilldriver.ManifestThrottle],
[backfilldriver.ManifestSkips], [backfilldriver.MergerStaging],
[backfilldriver.StagingIsolator], [backfilldriver.TableStager] and
[backfilldriver.UndoLogWriter].
[NewWithDB] looks them up once; a job that needs one the Runner lacks is
refused before any work. The conformance suites of backfilltest test each
one an implementation has.

# Errors

Errors are wrapped with %w; test them with errors.Is against the sentinels
of this package (such as [ErrInvalidConfig]), and with errors.As for
[*ChunkError] (which chunk failed), [*PartialError] (what completed before a
failure). Rejected rows are not errors: they are rows of the exception queue
([backfilldriver.Manifest.Exceptions]). [IsRetryable] tells transient database errors,
which the runner retries up to [Config.MaxAttempts] times (waits first, by
[Config.LockRetries]).
*/
package backfill
