package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/examples/internal/cli"
)

// correctionDelay is how much later than the original a simulated
// correction was modified at the source.
const correctionDelay = 6 * time.Hour

// Corrections returns simulated second versions of up to n events of src,
// as USGS publishes them when an analyst reviews an automatic solution:
// the automatic events of highest magnitude (ties by id) get status
// "reviewed", a magnitude 0.3 higher and an "updated" time 6 hours later.
// Event time and id are unchanged, so a correction falls into the same
// chunk as its original.
func Corrections(src *Quakes, n int) []Feature {
	var cand []Feature
	for _, f := range src.feats {
		q := f.Quake
		if f.Reason == "" && q.Status != nil && *q.Status == "automatic" && q.Mag != nil {
			cand = append(cand, f)
		}
	}
	slices.SortFunc(cand, func(a, b Feature) int {
		if c := -cmpFloat(*a.Quake.Mag, *b.Quake.Mag); c != 0 {
			return c
		}
		return strings.Compare(a.Quake.ID, b.Quake.ID)
	})
	out := make([]Feature, 0, min(n, len(cand)))
	for _, f := range cand[:min(n, len(cand))] {
		c := f
		mag := math.Round((*f.Quake.Mag+0.3)*100) / 100
		status := "reviewed"
		c.Quake.Mag, c.Quake.Status = &mag, &status
		c.Quake.Updated = f.Quake.Updated.Add(correctionDelay)
		c.Raw, _ = json.Marshal(map[string]any{"simulated_correction_of": f.Quake.ID})
		out = append(out, c)
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// delivery is one source version set arriving at the target.
type delivery struct {
	name, source string
	src          *Quakes
}

// Arrangement is one order in which the deliveries arrive, loaded into a
// scratch table of its own.
type Arrangement struct {
	Name, Table string
	// Deliveries names the deliveries in arrival order.
	Deliveries []string
	// Reports are the runs, one per delivery.
	Reports []backfill.Report
	// Differ is the number of rows in which the table differs from the
	// in-order table (rows of either missing from the other).
	Differ int64
	// Corrected is how many target rows carry their correction.
	Corrected int64
}

// CorrectionResult is what [correction] found.
type CorrectionResult struct {
	Corrections  int
	Arrangements []Arrangement
}

// Same reports whether every arrangement ended in the in-order state, with
// every correction applied.
func (r CorrectionResult) Same() bool {
	for _, a := range r.Arrangements {
		if a.Differ != 0 || a.Corrected != int64(r.Corrections) {
			return false
		}
	}
	return true
}

// correction simulates corrections of some events and loads the original
// file and the corrections in three arrangements, each into a scratch
// table of its own (the earthquakes table is not touched):
//
//   - in order: the original, then the corrections (the way they were
//     published);
//   - out of order: the corrections first, then the original arriving
//     late (a re-delivered or delayed extract): its older versions of the
//     corrected events lose;
//   - one delivery: corrections and originals in the same chunks, the
//     correction first in the stream: the newer version survives the
//     in-chunk deduplication.
//
// It then compares each table with the in-order one.
func correction(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src *Quakes, chunker backfill.Chunker, o options) (CorrectionResult, error) {
	corr := Corrections(src, o.corrections)
	res := CorrectionResult{Corrections: len(corr)}
	original := delivery{"original", quakesSrc, src}
	corrected := delivery{"correction", "simulated corrections of " + quakesSrc, NewQuakes(corr)}
	late := original
	late.name = "original (late)"
	both := delivery{"both at once", corrected.source + " and the original", NewQuakes(append(slices.Clone(corr), src.Features()...))}
	arrangements := []struct {
		name, table string
		deliveries  []delivery
	}{
		{"in order", "earthquakes_demo_in_order", []delivery{original, corrected}},
		{"out of order", "earthquakes_demo_out_of_order", []delivery{corrected, late}},
		{"one delivery", "earthquakes_demo_one_delivery", []delivery{both}},
	}

	fmt.Fprintf(out, "\ncorrection: %d simulated corrections: the automatic events of highest magnitude become reviewed, mag +0.3, updated +%s\n",
		len(corr), correctionDelay)
	runner, err := newRunner(db, logger, nil, o)
	if err != nil {
		return res, err
	}
	for _, a := range arrangements {
		// A scratch copy of the target, emptied so the demo can be rerun.
		if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (LIKE earthquakes INCLUDING ALL); TRUNCATE %[1]s`, a.table)); err != nil {
			return res, fmt.Errorf("scratch table %s: %w", a.table, err)
		}
		ar := Arrangement{Name: a.name, Table: a.table}
		for i, d := range a.deliveries {
			name := fmt.Sprintf("earthquakes-demo/%s/%d-%s", strings.ReplaceAll(a.name, " ", "-"), i+1, strings.Fields(d.name)[0])
			rep, err := runner.Run(ctx, quakeJob(name, d.source, d.src, chunker, a.table, true))
			if err != nil {
				return res, cli.RunError(name, planFlag, err)
			}
			c := rep.Counts
			label := ""
			if i == 0 {
				label = a.name
			}
			fmt.Fprintf(out, "  %-13s %d %-16s batch %3d  rows %4d  inserted %4d  updated %3d  unchanged %4d  rejected %d  dedup %3d\n",
				label, i+1, d.name, rep.BatchID, c.Read, c.Inserted, c.Updated, c.Unchanged, c.Rejected, c.Deduplicated)
			ar.Deliveries = append(ar.Deliveries, d.name)
			ar.Reports = append(ar.Reports, rep)
		}
		if ar.Corrected, err = countCorrected(ctx, db, a.table, corr); err != nil {
			return res, err
		}
		if ar.Differ, err = differ(ctx, db, arrangements[0].table, a.table); err != nil {
			return res, err
		}
		res.Arrangements = append(res.Arrangements, ar)
	}
	for _, a := range res.Arrangements[1:] {
		fmt.Fprintf(out, "  final state: %s = in order: %t (%d rows differ)\n", a.Name, a.Differ == 0, a.Differ)
	}
	for _, a := range res.Arrangements {
		fmt.Fprintf(out, "  %s: %d of %d corrections in the table\n", a.Table, a.Corrected, len(corr))
	}
	return res, nil
}

// countCorrected counts the rows of table that hold their correction's
// version, magnitude and status.
func countCorrected(ctx context.Context, db *sqlx.DB, table string, corr []Feature) (int64, error) {
	var ids, updated []string
	var mags []float64
	for _, f := range corr {
		ids = append(ids, f.Quake.ID)
		updated = append(updated, f.Quake.Updated.Format(time.RFC3339Nano))
		mags = append(mags, *f.Quake.Mag)
	}
	var n int64
	err := db.GetContext(ctx, &n, `SELECT count(*) FROM `+table+` t
		JOIN unnest($1::text[], $2::timestamptz[], $3::float8[]) u(id, updated, mag) USING (id)
		WHERE t.source_updated_at = u.updated AND t.mag = u.mag AND t.status = 'reviewed'`,
		pq.Array(ids), pq.Array(updated), pq.Array(mags))
	if err != nil {
		return 0, fmt.Errorf("count corrections in %s: %w", table, err)
	}
	return n, nil
}

// differ counts the rows that are in one table and not in the other,
// comparing the data columns (lineage columns name different batches in
// each arrangement).
func differ(ctx context.Context, db *sqlx.DB, a, b string) (int64, error) {
	var n int64
	cols := strings.Join(quakeColumns, ", ")
	err := db.GetContext(ctx, &n, fmt.Sprintf(`SELECT count(*) FROM (
		(SELECT %[3]s FROM %[1]s EXCEPT ALL SELECT %[3]s FROM %[2]s) UNION ALL (SELECT %[3]s FROM %[2]s EXCEPT ALL SELECT %[3]s FROM %[1]s)) d`, a, b, cols))
	if err != nil {
		return 0, fmt.Errorf("compare %s with %s: %w", a, b, err)
	}
	return n, nil
}
