package backfill

import "github.com/pgbackfill/backfill/backfilltype"

// Unchanged deliveries and rollback. Lineage names only the batch that
// last changed a row, so a row a later batch delivered unchanged still
// names the earlier one. After its merge, each chunk with unchanged rows
// records, per batch that last wrote them, how many it delivered and
// their least and greatest identity (one manifest row per chunk and owner,
// never one per row). A rollback of batch B treats a row of B within the
// bounds a done chunk of a later batch D recorded for owner B as
// delivered by D: exact about which batches, conservative between the
// bounds, never silent. The design note docs/design/rollback.md weighs
// the alternatives.

// RollbackConflict is one row a rollback would delete or restore although
// a later batch that is still applied changed or delivered it.
type RollbackConflict = backfilltype.RollbackConflict
