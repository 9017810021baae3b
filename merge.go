package backfill

import (
	"github.com/pgbackfill/backfill/backfilldriver"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
)

// Column describes one column of a target as the merger found it.
type Column = backfilltype.Column

// TableInfo is a prepared target: the Target it came from, with defaults
// filled in, and its staged columns: first the Written columns of
// [backfilltype.Target.Columns] in order, then the computed ones (derived
// keys, hash).
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

// Values are converted for their columns by internal/pgconv, one
// converter per column resolved when the row writer is built (see
// newRowWriter); this file bridges the package's Column to it.

// TimeInfinity and TimeNegInfinity stand, in a date, timestamp or
// timestamptz column, for PostgreSQL's 'infinity' and '-infinity' (later
// and earlier than every other value). They are instants no column can
// hold otherwise (some 146 billion years from now or ago), compared with
// time.Time.Equal. They also suit lib/pq's pq.EnableInfinityTs, so that
// infinite source values read with lib/pq are written back as such.
var (
	TimeInfinity    = pgstore.TimeInfinity
	TimeNegInfinity = pgstore.TimeNegInfinity
)

// Normalizer is one named step of a [KeyRule]: a pure function from text
// to text. Its Name is part of the plan fingerprint, so changing the rules
// of a job is a plan change.
type Normalizer = backfilltype.Normalizer

// Built-in normalizers. Compose them in a [KeyRule]; they apply in order.
var (
	// Trim removes leading and trailing Unicode white space.
	Trim = backfilltype.Trim
	// CollapseSpace replaces every run of Unicode white space with one
	// ASCII space (it does not trim).
	CollapseSpace = backfilltype.CollapseSpace
	// CaseFold applies Unicode full case folding (golang.org/x/text/cases,
	// Unicode Standard section 3.13), so that "STRASSE", "straße" and
	// "Strasse" all fold to "strasse".
	CaseFold = backfilltype.CaseFold
	// NFC puts text in Unicode Normalization Form C (UAX #15), so that
	// precomposed and decomposed accents compare equal.
	NFC = backfilltype.NFC
	// NFKC puts text in Normalization Form KC: also folds compatibility
	// characters (full-width digits, ligatures).
	NFKC = backfilltype.NFKC
	// RemovePunctuation deletes Unicode punctuation characters.
	RemovePunctuation = backfilltype.RemovePunctuation
)

// KeyRule derives one key column of a [Keyless] target from a source
// column: the source value (text) passes through Rules in order.
type KeyRule = backfilltype.KeyRule
