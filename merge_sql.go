package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// This file builds the SQL of PGMerger, one function per statement. Every
// identifier is quoted through internal/sqlgen; values are bind parameters
// ($1 batch, $2 chunk of the undo log) or COPY data. The statements of
// each mode and policy are pinned by testdata/merge_*.golden.sql.

// ComparedColumns is the one definition of what a merge compares: which
// columns identify a row, which it writes, and which decide whether a
// staged row leaves its target row unchanged or updates it. The merge SQL,
// the validators, rollback and the fake merger in backfilltest all derive
// what they compare from it. Column lists are in [TableInfo.Columns] order.
type ComparedColumns = pgstore.ComparedColumns
