package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgbackfill/backfill"
)

// dryRun extracts every chunk into a counting writer, without a database,
// and prints what the data holds and what extraction costs.
func dryRun(ctx context.Context, out io.Writer, src *Flights, days backfill.Chunker, concurrency int) error {
	chunks, err := days.Chunks(ctx)
	if err != nil {
		return err
	}
	results := make([]*countWriter, len(chunks))
	durs := make([]time.Duration, len(chunks))
	errs := make([]error, len(chunks))
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	scanned0 := src.Scanned()
	for range concurrency {
		wg.Go(func() {
			for i := range next {
				w := &countWriter{chunk: chunks[i], seen: map[string]int{}, codes: map[string]bool{}}
				t := time.Now()
				errs[i] = src.Extract(ctx, chunks[i], w)
				durs[i] = time.Since(t)
				w.seen = nil // bounded by one chunk at a time
				results[i] = w
			}
		})
	}
	for i := range chunks {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	scanned := src.Scanned() - scanned0

	var (
		tot              countWriter
		minRows, maxRows = -1, -1
		codes            = map[string]bool{}
		reasons          = map[string]int{}
		emptyChunks      int
	)
	tot.codes = codes
	for i, w := range results {
		if errs[i] != nil {
			return fmt.Errorf("chunk %s: %w", chunks[i].ID, errs[i])
		}
		tot.rows += w.rows
		tot.rejects += w.rejects
		tot.nullDelay += w.nullDelay
		tot.nullDist += w.nullDist
		tot.seqOver1 += w.seqOver1
		tot.maxSeq = max(tot.maxSeq, w.maxSeq)
		tot.fullDups += w.fullDups
		tot.outside += w.outside
		tot.maxCode = max(tot.maxCode, w.maxCode)
		for c := range w.codes {
			codes[c] = true
		}
		for r, n := range w.reasons {
			reasons[r] += n
		}
		n := int(w.rows + w.rejects)
		if n == 0 {
			emptyChunks++
		}
		if minRows < 0 || n < int(results[minRows].rows+results[minRows].rejects) {
			minRows = i
		}
		if maxRows < 0 || n > int(results[maxRows].rows+results[maxRows].rejects) {
			maxRows = i
		}
	}
	sorted := slices.Clone(durs)
	slices.Sort(sorted)
	rowsOf := func(i int) int64 { return results[i].rows + results[i].rejects }
	ix := src.idx

	fmt.Fprintf(out, "dry run: %s, %d chunks, concurrency %d\n", days.Scope(), len(chunks), concurrency)
	fmt.Fprintf(out, "  file        written by %q; %d row groups of", src.pf.Metadata().CreatedBy, len(ix.rgs))
	for _, rg := range src.pf.RowGroups() {
		pages := "?"
		if oi, err := rg.ColumnChunks()[src.cols[iDate]].OffsetIndex(); err == nil {
			pages = fmt.Sprint(oi.NumPages())
		}
		fmt.Fprintf(out, " %d (%s pages)", rg.NumRows(), pages)
	}
	fmt.Fprintf(out, "\n  schema      %s\n", strings.Join(strings.Fields(src.pf.Schema().String()), " "))
	fmt.Fprintf(out, "  rows        %d written + %d rejected = %d of %d in the file (all accounted for: %t)\n",
		tot.rows, tot.rejects, tot.rows+tot.rejects, ix.rows, tot.rows+tot.rejects == ix.rows)
	fmt.Fprintf(out, "  rejects     %v\n", reasons)
	fmt.Fprintf(out, "  nulls       date %d, delay %d, distance %d (origin/destination nulls are among the rejects)\n", ix.nullDates, tot.nullDelay, tot.nullDist)
	fmt.Fprintf(out, "  half-open   rows outside their chunk's [Start, End): %d\n", tot.outside)
	fmt.Fprintf(out, "  per day     %d chunks (%d empty); fewest rows %d on %s, most %d on %s\n", len(chunks), emptyChunks,
		rowsOf(minRows), chunks[minRows].Start.Format("2006-01-02"), rowsOf(maxRows), chunks[maxRows].Start.Format("2006-01-02"))
	fmt.Fprintf(out, "  codes       %d distinct airports in origin/destination, longest %d characters\n", len(codes), tot.maxCode)
	fmt.Fprintf(out, "  key         %d rows have seq > 1 (a repeated (dep_local, origin, destination)); highest seq %d\n", tot.seqOver1, tot.maxSeq)
	fmt.Fprintf(out, "  duplicates  %d rows repeat an earlier row in every column (kept: seq tells them apart)\n", tot.fullDups)
	fmt.Fprintf(out, "  extract     %s wall, %.0f rows/s; per chunk min %s, median %s, max %s\n", elapsed.Round(time.Millisecond),
		float64(tot.rows+tot.rejects)/elapsed.Seconds(), sorted[0].Round(time.Microsecond), sorted[len(sorted)/2].Round(time.Microsecond), sorted[len(sorted)-1].Round(time.Microsecond))
	fmt.Fprintf(out, "  reads       %d rows iterated for %d emitted (%.3fx); index: %d samples every %d rows, built in %s\n",
		scanned, tot.rows+tot.rejects, float64(scanned)/float64(max(1, tot.rows+tot.rejects)), len(ix.samples), ix.stride, ix.built.Round(time.Millisecond))
	fmt.Fprintf(out, "  memory      %s\n", memoryLine())
	return nil
}

// countWriter is a [backfill.RowWriter] that only counts. One per chunk.
type countWriter struct {
	chunk                       backfill.Chunk
	rows, rejects               int64
	nullDelay, nullDist         int64
	seqOver1, fullDups, outside int64
	maxSeq                      int32
	maxCode                     int
	seen                        map[string]int // full rows of the chunk
	codes                       map[string]bool
	reasons                     map[string]int
}

func (w *countWriter) Write(ctx context.Context, v ...any) error {
	w.rows++
	dep, origin, dest, seq := v[0].(time.Time), v[1].(string), v[2].(string), v[3].(int32)
	if !w.chunk.Contains(dep) {
		w.outside++
	}
	if v[4] == nil {
		w.nullDelay++
	}
	if v[5] == nil {
		w.nullDist++
	}
	if seq > 1 {
		w.seqOver1++
	}
	w.maxSeq = max(w.maxSeq, seq)
	w.codes[origin], w.codes[dest] = true, true
	w.maxCode = max(w.maxCode, len(origin), len(dest))
	full := fmt.Sprint(dep.UnixMicro(), origin, dest, v[4], v[5])
	if w.seen[full] > 0 {
		w.fullDups++
	}
	w.seen[full]++
	return ctx.Err()
}

func (w *countWriter) Reject(ctx context.Context, raw any, column, reason string) error {
	w.rejects++
	if w.reasons == nil {
		w.reasons = map[string]int{}
	}
	w.reasons[reason]++
	return ctx.Err()
}
