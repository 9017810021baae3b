package rawvalue

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type node struct {
	Name string
	Next *node
}

// TestDisplayIsBounded: values fmt prints print the same; values that
// contain themselves, nest too deep or are too long are cut and marked,
// and the text is valid UTF-8 PostgreSQL can store.
func TestDisplayIsBounded(t *testing.T) {
	t.Parallel()
	for _, v := range []any{1, "s", 2.5, []int{1, 2}, [2]string{"a", "b"}, struct {
		A int
		B string
	}{1, "x"}, map[string]int{"b": 2, "a": 1}, &struct{ A int }{3}, fmt.Errorf("boom"), (*int)(nil), []int(nil)} {
		require.Equal(t, fmt.Sprint(v), Display(v), "%T", v)
	}
	require.Equal(t, "NULL", Display(nil))

	m := map[string]any{"k": 1}
	m["self"] = m
	require.Equal(t, "map[k:1 self:<cycle>]", Display(m))
	s := []any{1, nil}
	s[1] = s
	require.Equal(t, "[1 <cycle>]", Display(s))
	n := &node{Name: "a"}
	n.Next = n
	require.Contains(t, Display(n), "&{a 0x")

	var deep any = 1
	for range maxRawDepth + 5 {
		deep = []any{deep}
	}
	require.Contains(t, Display(deep), markTooDeep)

	long := strings.Repeat("é", MaxDisplay)
	got := Display(long)
	require.True(t, utf8.ValidString(got))
	require.LessOrEqual(t, len(got), MaxDisplay+len("…"))
	require.True(t, strings.HasSuffix(got, "…"))
	require.Equal(t, `"a\x00b"`, Display("a\x00b"))
	require.Equal(t, `"\xff"`, Display([]byte{0xff}))
	require.Equal(t, "NaN", Display(math.NaN()))
}

// TestValidPrefix: the longest prefix of at most n bytes that does not
// cut a character.
func TestValidPrefix(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", ValidPrefix("abc", 5))
	require.Equal(t, "ab", ValidPrefix("abc", 2))
	require.Equal(t, "a", ValidPrefix("aé", 2))
	require.Equal(t, "aé", ValidPrefix("aé", 3))
	require.Equal(t, "", ValidPrefix("€", 2))
}
