// Package faulttest is the fault suite (make test-faults):
// workers of one job run as separate processes (the worker subpackage) on
// simulated hosts, while the test (build tag faults) kills, freezes and
// cuts them off, restarts the server and puts PgBouncer in their path,
// then checks that every chunk was committed exactly once, that the
// target equals an uninterrupted run's, that every chunk's rows balance,
// and how long healthy workers waited behind frozen ones.
//
// This file is the job every worker runs: a synthetic, deterministic
// extractor that makes rows from its chunk's bounds, so that any process
// anywhere produces the same rows for a chunk without a source to read.
package faulttest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
)

// Spec describes the job. Every process of one run must use the same Spec
// (but Sleep), or the plan changes.
type Spec struct {
	// Name is the job's name (one run per name at a time).
	Name string
	// Table is the target table, created by [CreateTarget].
	Table string
	// Chunks is the number of chunks; RowsPerChunk their size in ids.
	Chunks, RowsPerChunk int
	// Sleep is how long the extractor waits per chunk before it writes,
	// so that faults hit chunks in flight. Not part of the plan.
	Sleep time.Duration
}

// Job is the backfill job of s: ids [0, Chunks*RowsPerChunk) in chunks of
// RowsPerChunk. Per chunk the extractor writes one row per id, and also
// a row that is rejected (a name longer than varchar(12), for ids that
// are multiples of 997) and a duplicate written before the row it
// duplicates (ids that are multiples of 101, deduplicated by KeepLast).
// onExtract, if not nil, is called when an extraction starts.
func (s Spec) Job(onExtract func(c backfill.Chunk)) backfill.Job {
	return backfill.Job{
		Name:        s.Name,
		Source:      "faulttest",
		CodeVersion: "v1",
		Chunker:     backfill.IntRange(0, int64(s.Chunks*s.RowsPerChunk), int64(s.RowsPerChunk)),
		ChunkColumn: "id",
		Rollback:    backfill.RollbackNone,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if onExtract != nil {
				onExtract(c)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(s.Sleep):
			}
			for id := c.Lo; id < c.Hi; id++ {
				if id%101 == 0 {
					if err := w.Write(ctx, id, "dup", int64(-1), "0.00"); err != nil {
						return err
					}
				}
				name := fmt.Sprintf("n%d", id)
				if id%997 == 0 {
					name = fmt.Sprintf("too-long-name-%d", id)
				}
				if err := w.Write(ctx, id, name, id%17, amount(id)); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{
			Table:   s.Table,
			Key:     []string{"id"},
			Columns: []string{"id", "name", "bucket", "amount"},
		},
	}
}

func amount(id int64) string { return fmt.Sprintf("%d.%02d", id%1000, id%100) }

// CreateTarget creates table and seeds it so that the job updates some
// rows (ids that are multiples of 7 hold stale values) and leaves others
// unchanged (multiples of 11 but not of 7 or 997 hold the job's values).
func CreateTarget(ctx context.Context, db *sqlx.DB, table string, s Spec) error {
	t := `"` + strings.ReplaceAll(table, `"`, `""`) + `"`
	n := s.Chunks * s.RowsPerChunk
	for _, q := range []string{
		`CREATE TABLE ` + t + ` (id bigint PRIMARY KEY, name varchar(12) NOT NULL, bucket bigint, amount numeric(10,2))`,
		`INSERT INTO ` + t + ` SELECT i, 'stale', 0, 0 FROM generate_series(0, $1 - 1, 7) i`,
		`INSERT INTO ` + t + ` SELECT i, 'n' || i, i % 17, ((i % 1000) || '.' || lpad((i % 100)::text, 2, '0'))::numeric
			FROM generate_series(0, $1 - 1, 11) i WHERE i % 7 <> 0 AND i % 997 <> 0`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, n)
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("faulttest: create and seed %s: %w", table, err)
		}
	}
	return nil
}
