package pgstore

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgconv"
)

// RowHasher computes the row hash of one target shape ([RowHash]); build
// it once per shape with [NewRowHasher].
type RowHasher struct {
	info backfilltype.TableInfo
	cols []int // indexes of the hashed columns, in column order
}

// NewRowHasher returns the row hasher of info: it hashes the written
// columns that change detection tracks ([ComparedColumns].Tracked) and
// whose stored form the row writer knows from the converted value
// (rowHashed); the merge compares the other tracked columns itself.
func NewRowHasher(info backfilltype.TableInfo) RowHasher {
	tracked := CompareColumns(info).Tracked
	h := RowHasher{info: info}
	for i, col := range info.Columns[:info.Written] {
		if slices.Contains(tracked, col.Name) && rowHashed(col) {
			h.cols = append(h.cols, i)
		}
	}
	return h
}

// RowHash returns the SHA-256 of a converted row's hashed columns (see
// [NewRowHasher] and [RowHasher.Sum]).
func RowHash(info backfilltype.TableInfo, values []any) []byte {
	return NewRowHasher(info).Sum(values)
}

// Sum returns the SHA-256 of the hashed columns of values, a converted
// row (values as pgconv's Convert returns them, in info.Columns order).
// It detects changed content; it never identifies a row. Two rows hash
// alike exactly when the merge without a hash column would find their
// hashed columns equal: each value is hashed by the canonical text of
// the value PostgreSQL stores for it (the package documentation of
// backfill, "Equality"), so numeric 1.5 and 1.50 differ (the scale is
// stored) and 1.50 and 15.0e-1 do not; -0 and 0 differ; a char(n)
// ignores trailing spaces; times are instants in UTC to the microsecond.
//
// The input is unambiguous: each column contributes a NULL marker byte
// (0 for NULL, 1 otherwise), then, for non-NULL values, a one-byte type
// family and the canonical text length-prefixed by 8 bytes.
func (h RowHasher) Sum(values []any) []byte {
	s := sha256.New()
	var lenbuf [8]byte
	for _, i := range h.cols {
		v := values[i]
		if v == nil {
			s.Write([]byte{0})
			continue
		}
		family, text := canonical(h.info.Columns[i], v)
		s.Write([]byte{1, family})
		binary.BigEndian.PutUint64(lenbuf[:], uint64(len(text)))
		s.Write(lenbuf[:])
		s.Write([]byte(text))
	}
	return s.Sum(nil)
}

// rowHashed reports whether the row hash covers column col: whether the
// text canonical makes of its converted values is one-to-one with the
// values PostgreSQL stores. Text passed through to PostgreSQL's own input
// function (interval, time, jsonb, arrays, enums, other types) may spell
// one stored value several ways; such a column is compared by the merge
// beside the hash column ([ComparedColumns].Compared). A column of
// unknown type (fakes) is hashed as its Go value.
func rowHashed(col backfilltype.Column) bool {
	if col.Kind != "" && col.Kind != "b" && col.Kind != "d" {
		return false
	}
	switch col.BaseType {
	case "", "int2", "int4", "int8", "float4", "float8", "numeric", "bool", "uuid", "bytea",
		"date", "timestamp", "timestamptz", "json", "text", "varchar", "bpchar", "citext":
		return true
	}
	return false
}

// canonical returns a type family byte and canonical text for v, a value
// as pgconv's Convert returns it for col (see [RowHasher.Sum]).
func canonical(col backfilltype.Column, v any) (byte, string) {
	switch x := v.(type) {
	case int64:
		return 'i', strconv.FormatInt(x, 10)
	case float64:
		if math.IsNaN(x) {
			// PostgreSQL stores one NaN.
			return 'f', "NaN"
		}
		// Shortest exact text: one text per float, -0 apart from 0, as
		// the merge compares floats (float8send).
		return 'f', strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		return 'b', strconv.FormatBool(x)
	case []byte:
		return 'y', string(x)
	case string:
		switch col.BaseType {
		case "numeric":
			if s, ok := pgconv.NumericText(x, col.Precision, col.Scale); ok {
				return 'n', s
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
		case "bpchar":
			if col.MaxLen > 0 {
				// char(n) pads every value to n: trailing spaces are
				// not stored apart.
				return 's', strings.TrimRight(x, " ")
			}
		}
		return 's', x
	case time.Time:
		return 't', x.UTC().Round(time.Microsecond).Format(time.RFC3339Nano)
	}
	return '?', strconv.Quote(DisplayValue(v))
}
