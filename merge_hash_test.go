package backfill

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/internal/pgstore"
)

func TestRowHashIsCanonicalAndUnambiguous(t *testing.T) {
	t.Parallel()
	info := TableInfo{
		Target: Target{Key: []string{"id"}},
		Columns: []Column{
			{Name: "id", Key: true, BaseType: "int8"},
			{Name: "a", BaseType: "text"},
			{Name: "b", BaseType: "text"},
			{Name: "n", BaseType: "numeric"},
			{Name: "f", BaseType: "float8"},
			{Name: "ts", BaseType: "timestamptz"},
		},
		Written: 6,
	}
	h := func(vals ...any) []byte { return pgstore.RowHash(info, vals) }
	base := []any{int64(1), "x", "y", "1.0", 0.5, "2024-01-01T00:00:00Z"}
	same := func(name string, a, b []any) {
		t.Helper()
		if !bytes.Equal(h(a...), h(b...)) {
			t.Errorf("%s: hashes differ", name)
		}
	}
	differ := func(name string, a, b []any) {
		t.Helper()
		if bytes.Equal(h(a...), h(b...)) {
			t.Errorf("%s: hashes equal", name)
		}
	}
	with := func(i int, v any) []any {
		c := append([]any(nil), base...)
		c[i] = v
		return c
	}
	same("the key is not hashed", base, with(0, int64(2)))
	same("numeric scale", base, with(3, "1.00"))
	same("numeric exponent", base, with(3, "10e-1"))
	same("negative zero", with(4, 0.0), with(4, math.Copysign(0, -1)))
	same("NaN payloads", with(4, math.NaN()), with(4, math.Float64frombits(0x7ff8000000000001)))
	same("instant in another zone", base, with(5, time.Date(2023, 12, 31, 19, 0, 0, 0, time.FixedZone("EST", -5*3600)).Format(time.RFC3339Nano)))
	differ("text changed", base, with(1, "z"))
	differ("NULL vs empty", with(1, nil), with(1, ""))
	differ("field boundaries", func() []any { c := with(1, "ab"); c[2] = "c"; return c }(), func() []any { c := with(1, "a"); c[2] = "bc"; return c }())
	differ("numeric value", base, with(3, "1.01"))
	differ("NaN vs number", with(4, math.NaN()), with(4, 0.0))
}
