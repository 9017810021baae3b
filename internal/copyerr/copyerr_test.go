package copyerr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/pgbackfill/backfill/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestParseRealCopyErrors: for values PostgreSQL refuses while reading
// COPY data, Parse names the line, the column (whatever characters its
// name holds) and the value as PostgreSQL shows them.
func TestParseRealCopyErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Exec(`CREATE TYPE mood AS ENUM ('happy', 'sad');
		CREATE DOMAIN positive AS int CHECK (VALUE > 0);
		CREATE DOMAIN present AS text NOT NULL;
		CREATE TABLE t (id int, "a, column: ""odd""" mood, "a" positive, p present, l mood)`)
	require.NoError(t, err)
	cols := []string{"id", `a, column: "odd"`, "a", "p", "l"}
	long := strings.Repeat("é", 80) // 160 bytes: shortened in the message
	cases := []struct {
		name string
		rows [][]any
		line int64
		want Reject
	}{
		{"enum label", [][]any{{1, "happy", 1, "x", "sad"}, {2, "angry", 1, "x", "sad"}}, 2,
			Reject{Column: `a, column: "odd"`, Value: "angry", Reason: `invalid input value for enum mood: "angry" (SQLSTATE 22P02)`}},
		{"domain check", [][]any{{1, "happy", -5, "x", "sad"}}, 1,
			Reject{Column: "a", Value: "-5", Reason: `value for domain positive violates check constraint "positive_check" (SQLSTATE 23514)`}},
		{"domain not null", [][]any{{1, "happy", 1, "x", "sad"}, {2, "happy", 1, "x", "sad"}, {3, "happy", 1, nil, "sad"}}, 3,
			Reject{Column: "p", Null: true, Reason: `domain present does not allow null values (SQLSTATE 23502)`}},
		{"long value shortened", [][]any{{1, "happy", 1, "x", long}}, 1,
			Reject{Column: "l", Value: long[:MaxDisplay], Truncated: true, Reason: `invalid input value for enum mood: "` + long + `" (SQLSTATE 22P02)`}},
		{"short value ending in dots", [][]any{{1, "happy", 1, "x", "no..."}}, 1,
			Reject{Column: "l", Value: "no...", Reason: `invalid input value for enum mood: "no..." (SQLSTATE 22P02)`}},
	}
	for _, c := range cases {
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		stmt, err := tx.Prepare(`COPY t (id, "a, column: ""odd""", a, p, l) FROM STDIN`)
		require.NoError(t, err)
		for _, r := range c.rows {
			_, err = stmt.Exec(r...)
			require.NoError(t, err)
		}
		_, err = stmt.Exec()
		_ = stmt.Close()
		_ = tx.Rollback()
		require.Error(t, err, c.name)
		line, rej, ok := Parse(err, cols)
		require.True(t, ok, "%s: %v", c.name, err)
		require.Equal(t, c.line, line, c.name)
		require.Equal(t, c.want, rej, c.name)
		// The refused value is found again in the row staged as line.
		require.True(t, rej.Matches(c.rows[line-1][indexOf(cols, rej.Column)]), c.name)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestParseRefusesOtherErrors: errors that are not PostgreSQL refusing a
// value of COPY data are not parsed.
func TestParseRefusesOtherErrors(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"not pq":         errors.New(`COPY t, line 1, column a: "x"`),
		"unique":         &pq.Error{Code: "23505", Message: "duplicate key", Where: `COPY t, line 1`},
		"no copy where":  &pq.Error{Code: "22P02", Message: "invalid input", Where: `SQL function "f"`},
		"line zero":      &pq.Error{Code: "22P02", Message: "invalid input", Where: `COPY t, line 0, column a: "x"`},
		"line overflows": &pq.Error{Code: "22P02", Message: "invalid input", Where: `COPY t, line 99999999999999999999, column a: "x"`},
	} {
		_, _, ok := Parse(err, []string{"a"})
		require.False(t, ok, name)
	}
	// Wrapped, and for a whole line: no column.
	line, rej, ok := Parse(fmt.Errorf("stage: %w", &pq.Error{Code: "22P04", Message: "extra data after last expected column", Where: "COPY t, line 7"}), []string{"a"})
	require.True(t, ok)
	require.Equal(t, int64(7), line)
	require.Equal(t, Reject{Reason: "extra data after last expected column (SQLSTATE 22P04)"}, rej)
	// The longest column name that fits wins: "a" is a prefix of "a: b".
	_, rej, ok = Parse(&pq.Error{Code: "22P02", Message: "m", Where: `COPY t, line 1, column a: b: "v"`}, []string{"a", "a: b"})
	require.True(t, ok)
	require.Equal(t, "a: b", rej.Column)
	require.Equal(t, "v", rej.Value)
}

// TestTextIsWhatLibPQSends: Text gives lib/pq's COPY text of each type
// the conversion produces, and Matches compares with it.
func TestTextIsWhatLibPQSends(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 3, 10, 12, 0, 0, 500, time.UTC)
	for v, want := range map[any]string{
		"s": "s", int64(-3): "-3", 4: "4", int32(5): "5", 1.5: "1.5", float32(0.25): "0.25", true: "true",
		at: string(pq.FormatTimestamp(at)),
	} {
		got, ok := Text(v)
		require.True(t, ok, "%T", v)
		require.Equal(t, want, got, "%T", v)
		require.True(t, Reject{Value: want}.Matches(v), "%T", v)
	}
	got, ok := Text([]byte{0xde, 0xad})
	require.True(t, ok)
	require.Equal(t, `\xdead`, got)
	_, ok = Text(struct{}{})
	require.False(t, ok)
	require.False(t, Reject{Value: "x"}.Matches(struct{}{}))
	require.True(t, Reject{Null: true}.Matches(nil))
	require.False(t, Reject{Null: true}.Matches("x"))
	require.False(t, Reject{Value: ""}.Matches(nil))
	require.True(t, Reject{Value: "abc", Truncated: true}.Matches("abcdef"))
	require.False(t, Reject{Value: "abc"}.Matches("abcdef"))
}

// TestLinesMapRows: whatever rows are skipped between the staged ones,
// Row gives back the row staged as each line, and 0 outside them.
func TestLinesMapRows(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		var l Lines
		var staged []int64
		row := int64(0)
		for range rapid.IntRange(0, 50).Draw(rt, "n") {
			row += 1 + int64(rapid.IntRange(0, 3).Draw(rt, "skip")*rapid.IntRange(0, 1).Draw(rt, "skips"))
			l.Add(row)
			staged = append(staged, row)
		}
		for i, want := range staged {
			require.Equal(rt, want, l.Row(int64(i+1)), "line %d", i+1)
		}
		require.Zero(rt, l.Row(0))
		require.Zero(rt, l.Row(int64(len(staged)+1)))
	})
}
