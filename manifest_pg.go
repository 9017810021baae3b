package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// PGManifest is the PostgreSQL [Manifest]. It keeps its tables in one
// schema (default "backfill") of the target database, so that a chunk's
// checkpoint commits in the same transaction as its merge. Tables: runs,
// chunks, exceptions (the exception queue), events (the audit log) and
// schema_migrations.
type PGManifest = pgstore.Manifest

// NewPGManifest returns a PostgreSQL manifest in schema ("" means
// "backfill"). The schema is created and migrated by [PGManifest.Migrate]
// (an administrator's step, "backfill migrate"), or by [PGManifest.Init]
// when the role may. schema is one
// identifier, taken literally and always quoted: "ops.backfill" is the
// schema of that name (with a dot), never schema backfill of a database
// ops; do not quote it yourself.
func NewPGManifest(schema string) *PGManifest {
	return pgstore.NewManifest(schema)
}

// [PGManifest.Init], [PGManifest.Migrate] and [PGManifest.Version] create,
// migrate and read the manifest's schema; [PrivilegeError] lists what the
// runtime role needs.
