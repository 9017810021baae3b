package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// Least privilege. An administrator creates and migrates the manifest's
// schema once ([PGManifest.Migrate], the command "backfill migrate"); the
// role that runs jobs then needs no DDL privilege for the manifest:
// [PGManifest.Init] only reads the schema's version when it is current.
// What the runtime role needs, and what [Runner.Run] checks before it
// creates or resumes a batch (the target's part is on [Runner.Run]'s
// privilege check, [Runner.checkTargetSchema]):
//
//   - USAGE on the manifest's schema; SELECT, INSERT, UPDATE and DELETE on
//     its tables (SELECT only on schema_migrations); USAGE on its
//     sequences, if any;
//   - TEMPORARY on the database (staging tables are temporary tables).

// PrivilegeError lists every privilege the session's role lacks for a
// job, with the statements to grant them. It wraps [ErrPrivilege].
type PrivilegeError = pgstore.PrivilegeError
