package pgstore

import (
	"encoding/json"

	"github.com/pgbackfill/backfill/internal/rawvalue"
)

// RawJSON renders a rejected row for the exception queue (see
// rawvalue.JSON).
func RawJSON(names []string, values []any, raw any) json.RawMessage {
	return rawvalue.JSON(names, values, raw)
}

// DisplayValue renders v for an exception's value column (see
// rawvalue.Display).
func DisplayValue(v any) string { return rawvalue.Display(v) }

// ValidPrefix returns the longest prefix of s of at most n bytes that
// does not cut a UTF-8 sequence.
func ValidPrefix(s string, n int) string { return rawvalue.ValidPrefix(s, n) }
