package backfill

import (
	"encoding/json"

	"github.com/pgbackfill/backfill/internal/rawvalue"
)

// Rejected rows keep what the extractor passed, whatever it is, rendered
// within limits by internal/rawvalue: rawJSON for the exception's raw
// jsonb, displayValue for its value text.

// rawJSON renders a rejected row for the exception queue (see
// rawvalue.JSON).
func rawJSON(names []string, values []any, raw any) json.RawMessage {
	return rawvalue.JSON(names, values, raw)
}

// displayValue renders v for an exception's value column (see
// rawvalue.Display).
func displayValue(v any) string { return rawvalue.Display(v) }

// validPrefix returns the longest prefix of s of at most n bytes that
// does not cut a UTF-8 sequence.
func validPrefix(s string, n int) string { return rawvalue.ValidPrefix(s, n) }
