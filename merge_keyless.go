package backfill

import "github.com/pgbackfill/backfill/backfilltype"

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
