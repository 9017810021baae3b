package backfilltype

import (
	"time"
)

// TimeSplit is how a run's time splits: Total = Working + Paused + Idle
// + the sum of Throttled, by the definition of [StatusTime] (the status
// and the report split a run's time alike). Each instant counts once:
// paused first (from a "run_paused" event to the run's next event of
// another "run_..." kind), then throttled (attributed to the signal whose
// hold started first, when several hold at once, in any process), then
// idle (no worker of the run alive: between calls of Run, a dead run
// after a crash, a cancelled run until it is resumed), else working.
type TimeSplit struct {
	// Start is when the run was created; End when it finished, now while
	// it is running or paused (else its last update).
	Start, End time.Time
	Total      time.Duration
	Working    time.Duration
	Paused     time.Duration
	Idle       time.Duration
	// Throttled is the time held, by signal name.
	Throttled map[string]time.Duration
}

// SetKnobParams are the arguments of [Manifest.SetKnob]: the knob Key of
// run BatchID is set to Value (a number as text, or "default"), by Actor
// for the reason Why (both required).
type SetKnobParams struct {
	BatchID int64
	Key     string
	Value   string
	Actor   string
	Why     string
}

// JobChunks is the state of the latest run of a job, as metrics read it
// from the manifest ([Manifest.JobChunks]): the same from any process.
type JobChunks struct {
	// Job is the job's name; BatchID and RunStatus its latest run's.
	Job       string
	BatchID   int64
	RunStatus RunStatus
	// Chunks counts the run's chunks by status: the manifest's (pending,
	// done, failed, open, staged) with the pending chunks held by a live
	// lease counted as [ChunkLeased] instead. Statuses with no chunk are
	// absent.
	Chunks map[ChunkStatus]int64
	// Skipped counts the done chunks whose staging and merge a replay with
	// backfill.Job.SkipUnchanged skipped
	// ([ChunkState.Skipped]); they are among
	// Chunks[ChunkDone].
	Skipped int64
	// Counts are the rows of the run's done, open and staged chunks.
	Counts Counts
	// LastDone is when the run's latest chunk was checkpointed (zero
	// when none was); SinceLastDone is the time since, by the server's
	// clock (0 when none was).
	LastDone      time.Time
	SinceLastDone time.Duration
}

// MigrateResult is what [Manifest.MigrateGrant] did.
type MigrateResult struct {
	// From is the schema's version before this call, read under the
	// migration's lock: when several callers migrate at once, one reports
	// the migration and the others From == To.
	From int
	// To is the schema's version after the call.
	To int
	// Granted lists the GRANT statements run whose privileges the role
	// has afterwards, in order.
	Granted []string
	// NotGranted lists the privileges a role of the call still lacks
	// after its GRANT statements: PostgreSQL grants nothing, with only a
	// warning, when the caller holds the privilege without its grant
	// option. Why names the object's owner, who can grant it.
	NotGranted []RolePrivilege
}

// Privilege is one privilege the session's role lacks: on which object,
// which privilege, and the GRANT statement that gives it.
type Privilege struct {
	// Object is the object's kind and quoted name, such as
	// `table "backfill"."runs"` or `database "app"`.
	Object string
	// Privilege is the privilege's name as GRANT spells it: SELECT,
	// INSERT, UPDATE, DELETE, USAGE, CREATE, TEMPORARY, or OWNER for
	// what only the object's owner (or a member of its role) may do.
	Privilege string
	// Grant is the statement an administrator runs to give it, with
	// every identifier quoted. For OWNER it is "ALTER TABLE|VIEW ...
	// OWNER TO role;", or the GRANT of the owner's role to the session's
	// role only when the owner is a plain NOLOGIN role without SUPERUSER,
	// CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS or pg_* memberships
	// (never membership in a superuser or otherwise privileged role).
	Grant string
	// Why says what needs it.
	Why string
}

// RolePrivilege is a privilege a named role lacks.
type RolePrivilege struct {
	// Role is the role that lacks it.
	Role string
	Privilege
	// Owner is the object's owner: the owner (or a superuser, or a role
	// holding the privilege WITH GRANT OPTION) can grant it.
	Owner string
}

// ChunkLeased is the status the PostgreSQL manifest's per-job chunk
// counts (JobChunks) give a pending chunk whose lease a live worker
// holds: a chunk in flight. It is not a status of the manifest's rows.
const ChunkLeased ChunkStatus = "leased"
