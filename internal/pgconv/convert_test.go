package pgconv

import (
	"context"
	"database/sql"
	"math/big"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pgbackfill/backfill/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func col(base string) Column {
	return Column{Name: "c", Type: base, BaseType: base}
}

// TestConvertedValuesCopy: values of many Go types, converted, go
// through lib/pq's COPY into columns of their types.
func TestConvertedValuesCopy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	_, err := db.Exec(`CREATE TYPE mood AS ENUM ('happy', 'sad');
		CREATE TABLE t (i interval, m mood, u uuid, r real, n numeric, b boolean, tz timestamptz, j jsonb, a int4[], ip inet, s text)`)
	require.NoError(t, err)
	cols := []Column{col("interval"), col("mood"), col("uuid"), col("float4"), col("numeric"), col("bool"), col("timestamptz"), col("jsonb"), col("_int4"), col("inet"), col("text")}
	rows := [][]any{
		{-1500 * time.Nanosecond, testCode("happy"), testUUID{1, 2, 3}, 1e-45, testDecimal{-5, -3}, " Yes ", "2024-03-10 12:00:00.5+05:30",
			`{"a":"\\u0000"}`, pq.Array([]int{1, 2}), net.ParseIP("2001:db8::1"), sql.NullString{String: "x", Valid: true}},
		{sql.Null[time.Duration]{V: time.Minute, Valid: true}, "sad", "{A0EEBC99-9C0B4EF8-BB6D6BB9-BD380A11}", float32(2.5), new(big.Int).SetInt64(-7), "of", "2024-03-10T12:00:00+0100",
			map[string]any{"k": []any{1, "two"}}, "{3}", "192.0.2.1", testCode("y")},
		{nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil},
	}
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	stmt, err := tx.Prepare("COPY t (i, m, u, r, n, b, tz, j, a, ip, s) FROM STDIN")
	require.NoError(t, err)
	for _, row := range rows {
		out := make([]any, len(row))
		for i, v := range row {
			var reason string
			out[i], reason = Convert(cols[i], v)
			require.Empty(t, reason, "%s %v", cols[i].BaseType, v)
		}
		_, err := stmt.Exec(out...)
		require.NoError(t, err)
	}
	_, err = stmt.Exec()
	require.NoError(t, err)
	require.NoError(t, stmt.Close())
	var got []string
	require.NoError(t, sqlx.Select(tx, &got, `SELECT concat_ws('|', i, m, u, r, n, b, tz AT TIME ZONE 'UTC', j, a, ip, s) FROM t ORDER BY m NULLS LAST`))
	require.Equal(t, []string{
		"-00:00:00.000002|happy|01020300-0000-0000-0000-000000000000|1e-45|-0.005|t|2024-03-10 06:30:00.5|{\"a\": \"\\\\u0000\"}|{1,2}|2001:db8::1|x",
		"00:01:00|sad|a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11|2.5|-7|f|2024-03-10 11:00:00|{\"k\": [1, \"two\"]}|{3}|192.0.2.1|y",
		"",
	}, got)
}

// BenchmarkConvertNormalize measures the types outside the fast path.
func BenchmarkConvertNormalize(b *testing.B) {
	v := sql.NullString{String: "x", Valid: true}
	q := testQty(3)
	c, n := col("text"), col("int8")
	for b.Loop() {
		_, _ = Convert(c, v)
		_, _ = Convert(n, q)
	}
}

// TestForResolvesFamily: For picks the family converter of the column's
// base type once, text only for a type no family checks, and a
// Converter's Convert gives what Convert gives.
func TestForResolvesFamily(t *testing.T) {
	t.Parallel()
	ptr := func(f convertFunc) uintptr { return reflect.ValueOf(f).Pointer() }
	for base, want := range families {
		c := For(col(base))
		require.Equal(t, ptr(want), ptr(c.conv), base)
	}
	for _, base := range []string{"mood", "inet", "_int4", "tsrange"} {
		require.Equal(t, ptr(convertOther), ptr(For(col(base)).conv), base)
	}
	c := For(Column{Name: "q", BaseType: "int2", Type: "smallint"})
	for _, v := range []any{int64(1), "7", 1 << 20, nil, "x", 2.5} {
		got, reason := c.Convert(v)
		want, wantReason := Convert(Column{Name: "q", BaseType: "int2", Type: "smallint"}, v)
		require.Equal(t, want, got, "%v", v)
		require.Equal(t, wantReason, reason, "%v", v)
	}
}
