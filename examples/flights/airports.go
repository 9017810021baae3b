package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/pgbackfill/backfill"
)

// airportColumns are the airports target columns, in CSV order.
var airportColumns = []string{"iata", "name", "city", "state", "country", "latitude", "longitude"}

// Airports reads airports.csv. It implements [backfill.Extractor] for the
// single chunk of backfill.List(filepath.Base(Path)): the file is small
// (3,376 rows), so one chunk, one transaction.
//
// "NA" in city or state (12 rows, e.g. military bases and Pacific islands)
// is the export's marker for a missing value and is loaded as NULL. A row
// whose coordinates do not parse is rejected, naming the column.
type Airports struct {
	Path string
}

// Extract writes every row of the file.
func (a Airports) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	if c.Kind != backfilltype.KindList || c.Item != filepath.Base(a.Path) {
		return fmt.Errorf("airports: extract: chunk %s is not the file %s", c.ID, filepath.Base(a.Path))
	}
	f, err := os.Open(a.Path)
	if err != nil {
		return fmt.Errorf("airports: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1 // a short row is rejected below, not fatal
	header, err := r.Read()
	if err != nil {
		return fmt.Errorf("airports: %s: header: %w", a.Path, err)
	}
	for i, name := range airportColumns {
		if i >= len(header) || header[i] != name {
			return fmt.Errorf("airports: %s: header %q, want %q", a.Path, header, airportColumns)
		}
	}
	for line := 2; ; line++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			if err := w.Reject(ctx, map[string]any{"line": line, "error": pe.Error()}, "", "malformed CSV"); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("airports: %s: %w", a.Path, err)
		}
		if len(rec) != len(airportColumns) {
			if err := w.Reject(ctx, map[string]any{"line": line, "fields": rec}, "", fmt.Sprintf("%d fields, want %d", len(rec), len(airportColumns))); err != nil {
				return err
			}
			continue
		}
		raw := map[string]any{"line": line, "fields": rec}
		vals := make([]any, len(rec))
		for i, s := range rec[:5] {
			vals[i] = s
			if s == "NA" && (airportColumns[i] == "city" || airportColumns[i] == "state") {
				vals[i] = nil
			}
		}
		if strings.TrimSpace(rec[0]) == "" {
			if err := w.Reject(ctx, raw, "iata", "cannot derive key: iata is empty"); err != nil {
				return err
			}
			continue
		}
		var bad string
		for i := 5; i < 7; i++ {
			x, err := strconv.ParseFloat(rec[i], 64)
			if err != nil {
				bad = airportColumns[i]
				break
			}
			vals[i] = x
		}
		if bad != "" {
			if err := w.Reject(ctx, raw, bad, "not a number"); err != nil {
				return err
			}
			continue
		}
		// A code longer than the column is rejected by the writer itself.
		if err := w.Write(ctx, vals...); err != nil {
			return err
		}
	}
}
