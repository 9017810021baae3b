package backfill

import "github.com/pgbackfill/backfill/internal/pgstore"

// Free text in the manifest.
//
// Much of what the manifest records is text the library does not control:
// an exception's column, value and reason (from RowWriter.Reject or a
// source), a chunk's or run's error (an extractor's error text, a source
// driver's message), a worker id, an operator's actor and why, event
// details. PostgreSQL's text and jsonb cannot hold a NUL character or
// invalid UTF-8: written as they came, such text would fail the very
// statement that records a failure. Every manifest, PGManifest and the
// fake of backfilltest alike, stores free text through ManifestText and
// JSON through ManifestJSON, so that what is recorded is the same
// everywhere and recording never fails because of the text.

// ManifestText returns s as a manifest stores free text: every byte
// sequence that is not valid UTF-8 replaced by U+FFFD (the Unicode
// replacement character), and every NUL character by U+2400 (SYMBOL FOR
// NULL). Text that is valid UTF-8 without NUL, the common case, is
// returned unchanged, without allocating. Manifest implementations store
// every free-text field (exception column, value and reason, errors,
// worker ids, actors, reasons) through it.
func ManifestText(s string) string {
	return pgstore.ManifestText(s)
}

// ManifestJSON returns b, a JSON document, as a manifest stores JSON
// (jsonb): unchanged when jsonb takes it; otherwise decoded and encoded
// again with every string and object key passed through ManifestText
// (a \u0000 escape and a NUL become U+2400, an unpaired surrogate escape
// or invalid UTF-8 U+FFFD). Text that is not JSON at all is stored as a
// JSON string of its ManifestText, so that recording never fails because
// of what a caller put in a detail.
func ManifestJSON(b []byte) []byte {
	return pgstore.ManifestJSON(b)
}

// ManifestException returns e as a manifest stores it: Column, Value and
// Reason through ManifestText, Raw through ManifestJSON.
func ManifestException(e Exception) Exception {
	return pgstore.ManifestException(e)
}

// ManifestCheckResult returns r as a manifest stores it: Check, Expected,
// Actual and each Sample entry through ManifestText, Detail through
// ManifestJSON. r's Sample is not modified.
func ManifestCheckResult(r CheckResult) CheckResult {
	return pgstore.ManifestCheckResult(r)
}
