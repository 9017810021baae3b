package backfill

import (
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
)

// Column describes one column of a target as the merger found it.
type Column = backfilltype.Column

// TableInfo is a prepared target: the Target it came from, with defaults
// filled in, and its staged columns: first the Written columns of
// [Target.Columns] in order, then the computed ones (derived keys, hash).
type TableInfo = backfilltype.TableInfo

// Merger loads a chunk's rows into staging and merges them into the target
// by business key. The PostgreSQL implementation, the default, is
// internal;
// backfilltest.Merger the in-memory fake; backfilltest.TestMerger the
// conformance suite.
//
// Methods take the executor per call; Stage receives the chunk's
// transaction. Implementations must be safe for concurrent use on
// different transactions.
type Merger = backfilldriver.Merger
