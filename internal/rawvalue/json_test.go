package rawvalue

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestRawJSONKeepsWhatItCan: a value JSON or jsonb cannot hold becomes
// its display text, and only it; the rest of the row is kept as JSON.
func TestRawJSONKeepsWhatItCan(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	names := []string{"ok", "complex", "inf", "chan", "nul", "num", "raw", "time", "nested", "bad\xffname"}
	values := []any{"fine", complex(1, 2), struct{ F float64 }{math.Inf(1)}, make(chan int), struct{ S string }{"a\x00b"},
		json.Number("1e200000"), json.RawMessage(`"\ud800"`), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		map[string]any{"x\x00": []any{1.5, math.NaN(), "y"}}, 7, "extra"}
	raw := JSON(names, values, nil)
	require.True(t, json.Valid(raw), "%s", raw)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, "fine", got["ok"])
	require.Equal(t, "(1+2i)", got["complex"])
	require.Equal(t, "{+Inf}", got["inf"])
	require.IsType(t, "", got["chan"])
	require.Equal(t, `"{a\x00b}"`, got["nul"])
	require.Equal(t, "1e200000", got["num"])
	require.Equal(t, `"\ud800"`, got["raw"])
	require.Equal(t, "10000-01-01T00:00:00Z", got["time"])
	require.Equal(t, map[string]any{`"x\x00"`: []any{1.5, "NaN", "y"}}, got["nested"])
	require.Equal(t, float64(7), got[`"bad\xffname"`])
	require.Equal(t, "extra", got["$11"])
	var stored string
	require.NoError(t, db.Get(&stored, "SELECT $1::jsonb::text", string(raw)))

	require.JSONEq(t, `"(1+0i)"`, string(JSON(nil, nil, complex(1, 0))))
	require.JSONEq(t, `{"a":"(2+0i)","b":[1]}`, string(JSON(nil, nil, map[string]any{"a": complex(2, 0), "b": []any{1}})))
}

// TestRawJSONTruncatesLargeRows: a row's JSON beyond 64 KiB is stored as
// {"truncated": true, "bytes": N, "prefix": "..."}, itself at most 64 KiB
// of valid, jsonb-safe JSON.
func TestRawJSONTruncatesLargeRows(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	long := strings.Repeat(`quote " backslash \ \u0000 nul-text é 😀 <&> `+"\n\t", 3000)
	for _, values := range [][]any{{long}, {strings.Repeat("x", MaxJSON)}, {strings.Repeat("é", MaxJSON)}, {long, long}} {
		full, err := json.Marshal(map[string]any{"c": values[0]})
		require.NoError(t, err)
		names := []string{"c", "d"}[:len(values)]
		if len(values) > 1 {
			full, err = json.Marshal(map[string]any{"c": values[0], "d": values[1]})
			require.NoError(t, err)
		}
		raw := JSON(names, values, nil)
		require.LessOrEqual(t, len(raw), MaxJSON)
		require.True(t, json.Valid(raw))
		require.True(t, utf8.Valid(raw))
		var got struct {
			Truncated bool   `json:"truncated"`
			Bytes     int    `json:"bytes"`
			Prefix    string `json:"prefix"`
		}
		require.NoError(t, json.Unmarshal(raw, &got))
		require.True(t, got.Truncated)
		require.Equal(t, len(full), got.Bytes)
		require.True(t, strings.HasPrefix(string(full), got.Prefix))
		require.Greater(t, len(raw), MaxJSON-16, "the prefix fills the cap")
		var n int
		require.NoError(t, db.Get(&n, "SELECT length($1::jsonb->>'prefix')", string(raw)))
		require.Equal(t, utf8.RuneCountInString(got.Prefix), n)
	}
	small := JSON([]string{"c"}, []any{strings.Repeat("x", 1000)}, nil)
	require.JSONEq(t, `{"c":"`+strings.Repeat("x", 1000)+`"}`, string(small))
}
