package backfill

import (
	"context"
	"database/sql/driver"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"
)

// The per-row cost of the library's row writer beside the raw COPY
// encoding of the same values (issue 15, "Per-row cost"): run both in one
// go test run and compare their ns/op, e.g.
//
//	go test -run '^$' -bench 'RowWriter|CopyEncode' -benchmem
//
// BenchmarkCopyEncode is what an application writing the row with
// lib/pq's CopyIn costs on the client: database/sql's argument
// conversion, then COPY text of every value (copyText, the encoding lib/pq
// sends). BenchmarkRowWriterOrderLine is RowWriter.Write of the same
// values into the same encoder, directly (the Stager's path) and through
// the spool of the short-transaction path (kept in memory, replayed into
// the encoder every 1,000 rows, as a chunk's transaction does): the
// difference per op is the row writer's own cost per row.

// orderLineInfo is an 11-column order line: ints, numerics, text,
// timestamps, dates, a bool.
func orderLineInfo() TableInfo {
	return TableInfo{
		Target: Target{Table: "order_lines", Key: []string{"source_system", "order_no", "line_no"}},
		Columns: []Column{
			{Name: "source_system", BaseType: "text", Key: true},
			{Name: "order_no", BaseType: "int8", Key: true},
			{Name: "line_no", BaseType: "int4", Key: true},
			{Name: "product_code", BaseType: "varchar", Type: "character varying(20)", MaxLen: 20, NotNull: true},
			{Name: "description", BaseType: "text"},
			{Name: "quantity", BaseType: "int4", NotNull: true},
			{Name: "unit_price", BaseType: "numeric", Type: "numeric(12,2)", Precision: 12, Scale: 2, NotNull: true},
			{Name: "discount", BaseType: "numeric", Type: "numeric(5,4)", Precision: 5, Scale: 4},
			{Name: "ordered_at", BaseType: "timestamptz", NotNull: true},
			{Name: "ship_date", BaseType: "date"},
			{Name: "is_returned", BaseType: "bool", NotNull: true},
		},
		Written: 11,
	}
}

// orderLine fills vals with row i of the order lines, the Go types an
// extractor reading a source with lib/pq or from files passes.
func orderLine(vals []any, i int, at, ship time.Time) {
	vals[0] = "erp"
	vals[1] = int64(i)
	vals[2] = i%7 + 1
	vals[3] = "SKU-12345"
	vals[4] = "a description of the product"
	vals[5] = int64(i%50 + 1)
	vals[6] = "1234.56"
	vals[7] = "0.0500"
	vals[8] = at
	vals[9] = ship
	vals[10] = i%17 == 0
}

// copyText appends v in COPY's text format, as lib/pq's CopyIn encodes
// it: NULL as \N, text with \, tab, newline and carriage return escaped,
// bytea as \\x hex, times with their offset.
func copyText(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, `\N`...)
	case int64:
		return strconv.AppendInt(b, x, 10)
	case float64:
		return strconv.AppendFloat(b, x, 'f', -1, 64)
	case bool:
		return strconv.AppendBool(b, x)
	case time.Time:
		return x.AppendFormat(b, "2006-01-02 15:04:05.999999999Z07:00")
	case []byte:
		b = append(b, `\\x`...)
		const hex = "0123456789abcdef"
		for _, c := range x {
			b = append(b, hex[c>>4], hex[c&15])
		}
		return b
	case string:
		for i := 0; i < len(x); i++ {
			switch c := x[i]; c {
			case '\\':
				b = append(b, '\\', '\\')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, c)
			}
		}
		return b
	}
	panic("copyText: unexpected type")
}

// copySink is a Stager-like sink that encodes each row as a COPY text
// line, as lib/pq does for the chunk's COPY, and discards it.
type copySink struct {
	line []byte
	args []driver.Value
	rows int64
}

// encode converts values as database/sql does for a statement's
// arguments and encodes them as one COPY line, written to io.Discard.
func (s *copySink) encode(values []any) error {
	s.args = s.args[:0]
	for _, v := range values {
		dv, err := driver.DefaultParameterConverter.ConvertValue(v)
		if err != nil {
			return err
		}
		s.args = append(s.args, dv)
	}
	s.line = s.line[:0]
	for i, v := range s.args {
		if i > 0 {
			s.line = append(s.line, '\t')
		}
		s.line = copyText(s.line, v)
	}
	s.line = append(s.line, '\n')
	_, err := io.Discard.Write(s.line)
	s.rows++
	return err
}

func (s *copySink) Add(ctx context.Context, row int64, values []any) error {
	return s.encode(values)
}

// BenchmarkCopyEncode is the raw client cost of one order line sent with
// lib/pq's CopyIn: argument conversion and COPY text encoding.
func BenchmarkCopyEncode(b *testing.B) {
	at := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	ship := time.Date(2024, 1, 5, 0, 0, 0, 0, time.UTC)
	vals := make([]any, 11)
	s := &copySink{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		orderLine(vals, i, at, ship)
		if err := s.encode(vals); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRowWriterOrderLine is RowWriter.Write of the same order line
// into the same encoder: "direct" as a Stager receives the rows, "spool"
// through the short-transaction path's spool, replayed every 1,000 rows.
func BenchmarkRowWriterOrderLine(b *testing.B) {
	at := time.Date(2024, 1, 2, 3, 4, 5, 123456000, time.UTC)
	ship := time.Date(2024, 1, 5, 0, 0, 0, 0, time.UTC)
	info := orderLineInfo()
	c := Chunk{ID: "int:0/1", Kind: backfilltype.KindInt, Hi: 1}
	ctx := context.Background()
	b.Run("direct", func(b *testing.B) {
		s := &copySink{}
		w := newRowWriter(c, Job{}, info, s, 0, time.Now())
		vals := make([]any, 11)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			orderLine(vals, i, at, ship)
			if err := w.Write(ctx, vals...); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("spool", func(b *testing.B) {
		s := &copySink{}
		sp := &spool{}
		w := newRowWriter(c, Job{}, info, sp, 0, time.Now())
		vals := make([]any, 11)
		flush := func() {
			if err := sp.replay(ctx, func(row int64, values []any) error { return s.Add(ctx, row, values) }); err != nil {
				b.Fatal(err)
			}
			_ = sp.Close()
			*sp = spool{}
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			orderLine(vals, i, at, ship)
			if err := w.Write(ctx, vals...); err != nil {
				b.Fatal(err)
			}
			if sp.Len() == 1000 {
				flush()
			}
		}
		flush()
	})
}
