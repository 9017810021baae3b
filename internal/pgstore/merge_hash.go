package pgstore

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// RowHash returns the SHA-256 of the hashed columns of a converted row:
// every written column that is neither a key column nor History's
// ValidFrom, in column order. It detects changed content; it never
// identifies a row.
//
// The input is unambiguous: each column contributes a NULL marker byte
// (0 for NULL, 1 otherwise), then, for non-NULL values, a one-byte type
// family and the canonical text length-prefixed by 8 bytes. Canonical
// forms make values equal in PostgreSQL hash equal: numerics are reduced
// (1.0 and 1.00 both give "1"), floats are printed shortest with -0 as 0
// and every NaN as "NaN", times as UTC RFC 3339 rounded to microseconds.
func RowHash(info backfilltype.TableInfo, values []any) []byte {
	h := sha256.New()
	var lenbuf [8]byte
	for i, col := range info.Columns[:info.Written] {
		if col.Key || col.Name == info.Target.ValidFrom {
			continue
		}
		v := values[i]
		if v == nil {
			h.Write([]byte{0})
			continue
		}
		family, text := canonical(col, v)
		h.Write([]byte{1, family})
		binary.BigEndian.PutUint64(lenbuf[:], uint64(len(text)))
		h.Write(lenbuf[:])
		h.Write([]byte(text))
	}
	return h.Sum(nil)
}

// canonical returns a type family byte and canonical text for v, a value
// as ConvertValue returns it for col.
func canonical(col backfilltype.Column, v any) (byte, string) {
	switch x := v.(type) {
	case int64:
		return 'i', strconv.FormatInt(x, 10)
	case float64:
		switch {
		case math.IsNaN(x):
			return 'f', "NaN"
		case x == 0:
			return 'f', "0"
		}
		return 'f', strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return 'b', strconv.FormatBool(x)
	case []byte:
		return 'y', string(x)
	case string:
		switch col.BaseType {
		case "numeric":
			if r, ok := new(big.Rat).SetString(x); ok {
				return 'n', r.RatString()
			}
			return 'n', x
		case "timestamptz":
			if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
				return 't', t.UTC().Round(time.Microsecond).Format(time.RFC3339Nano)
			}
		case "timestamp":
			if t, err := time.Parse("2006-01-02 15:04:05.999999999", x); err == nil {
				return 't', t.Round(time.Microsecond).Format("2006-01-02 15:04:05.999999")
			}
		}
		return 's', x
	case time.Time:
		return 't', x.UTC().Round(time.Microsecond).Format(time.RFC3339Nano)
	}
	return '?', strconv.Quote(DisplayValue(v))
}
