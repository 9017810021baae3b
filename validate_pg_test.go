package backfill_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgbackfill/backfill/backfilltype"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// salesSetup is a target of sales keyed by a surrogate id, with a natural
// key (order_no) that has no unique index, a customer reference without a
// foreign key, and a source of two UTC days of 12 sales each, which tests
// edit before running the job.
type salesSetup struct {
	db   *sqlx.DB
	rows []sale
	zone *time.Location
	from time.Time // first day of the scope (2 days)
}

type sale struct {
	ID       int64
	OrderNo  string
	SoldAt   time.Time
	Region   string
	Customer any // int64 or nil
	Amount   string
	Qty      int64
}

var day1 = time.Date(2024, 3, 1, 0, 0, 0, 0, time.UTC)

const (
	chunkDay1 = "time:2024-03-01T00:00:00Z/2024-03-02T00:00:00Z"
	chunkDay2 = "time:2024-03-02T00:00:00Z/2024-03-03T00:00:00Z"
)

func newSales(t *testing.T) *salesSetup {
	t.Helper()
	db := pgtest.New(t)
	_, err := db.Exec(`
		CREATE TABLE customers (id int PRIMARY KEY);
		INSERT INTO customers SELECT generate_series(1, 5);
		CREATE TABLE sales (
			id bigint PRIMARY KEY,
			order_no text,
			sold_at timestamptz NOT NULL,
			region text NOT NULL,
			customer_id int,
			amount numeric(12,2),
			qty int,
			backfill_inserted_by bigint,
			backfill_updated_by bigint);
		CREATE INDEX ON sales (sold_at)`)
	require.NoError(t, err)
	s := &salesSetup{db: db, zone: time.UTC, from: day1}
	for id := int64(1); id <= 24; id++ {
		d := day1.AddDate(0, 0, int((id-1)/12))
		s.rows = append(s.rows, sale{ID: id, OrderNo: fmt.Sprintf("o-%d", id), SoldAt: d.Add(time.Duration((id-1)%12)*time.Hour + 30*time.Minute),
			Region: []string{"EU", "US"}[id%2], Customer: id%5 + 1, Amount: fmt.Sprintf("%d.50", id), Qty: id})
	}
	return s
}

func (s *salesSetup) job(validators ...backfill.Validator) backfill.Job {
	return backfill.Job{
		Name:        "sales",
		Chunker:     backfill.Days(s.from, s.from.AddDate(0, 0, 2), s.zone),
		Zone:        s.zone,
		ChunkColumn: "sold_at",
		Validators:  validators,
		Extractor: backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			for _, r := range s.rows {
				if !c.Contains(r.SoldAt) {
					continue
				}
				if err := w.Write(ctx, r.ID, r.OrderNo, r.SoldAt, r.Region, r.Customer, r.Amount, r.Qty); err != nil {
					return err
				}
			}
			return nil
		}),
		Target: backfill.Target{
			Table:   "sales",
			Key:     []string{"id"},
			Columns: []string{"id", "order_no", "sold_at", "region", "customer_id", "amount", "qty"},
		},
	}
}

// run runs job and returns its report, the recorded evidence and its
// error.
func (s *salesSetup) run(t *testing.T, job backfill.Job) (backfill.Report, []backfilltype.Validation, error) {
	t.Helper()
	r, err := backfill.New(s.db, nil)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), job)
	vs, verr := backfill.NewPGManifest("").Validations(context.Background(), s.db, rep.BatchID)
	require.NoError(t, verr)
	return rep, vs, err
}

// sabotage is a validator that passes after running stmt in the chunk
// of day 1 (UTC): it seeds a defect after the merge, before the checks
// that follow it.
func sabotage(stmt string) backfill.Validator { return sabotageIn(chunkDay1, stmt) }

// sabotageIn is sabotage in the chunk of the given ID, or in every chunk
// for "".
func sabotageIn(chunkID, stmt string) backfill.Validator {
	return backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		if chunkID != "" && sc.Chunk.ID != chunkID {
			return backfill.CheckResult{Check: "sabotage", Passed: true}, nil
		}
		_, err := tx.ExecContext(ctx, stmt)
		return backfill.CheckResult{Check: "sabotage", Passed: true}, err
	})
}

// evidence is the part of a recorded result that tests compare.
type evidence struct {
	Chunk, Check     string
	Passed           bool
	Expected, Actual string
	Sample           []string
}

func evidenceOf(vs []backfilltype.Validation, check string) []evidence {
	var out []evidence
	for _, v := range vs {
		if v.Check == check {
			out = append(out, evidence{Chunk: v.ChunkID, Check: v.Check, Passed: v.Passed, Expected: v.Expected, Actual: v.Actual, Sample: v.Sample})
		}
	}
	return out
}

func detailOf(t *testing.T, vs []backfilltype.Validation, check, chunk string) map[string]any {
	t.Helper()
	for _, v := range vs {
		if v.Check == check && v.ChunkID == chunk {
			var m map[string]any
			require.NoError(t, json.Unmarshal(v.Detail, &m))
			return m
		}
	}
	t.Fatalf("no %s result for %s", check, chunk)
	return nil
}

// requirePaused checks that a run stopped at a failed gate.
func requirePaused(t *testing.T, rep backfill.Report, err error) {
	t.Helper()
	require.ErrorIs(t, err, backfill.ErrGateFailed)
	require.Equal(t, backfill.RunPaused, rep.Status)
}

func requireCompleted(t *testing.T, rep backfill.Report, err error) {
	t.Helper()
	require.NoError(t, err)
	require.Equal(t, backfill.RunCompleted, rep.Status)
}

func requireEvidence(t *testing.T, want []evidence, vs []backfilltype.Validation, check string) {
	t.Helper()
	if diff := cmp.Diff(want, evidenceOf(vs, check), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("%s evidence (-want +got):\n%s", check, diff)
	}
}

func passing(check, expected, actual string) []evidence {
	return []evidence{
		{Chunk: chunkDay1, Check: check, Passed: true, Expected: expected, Actual: actual},
		{Chunk: chunkDay2, Check: check, Passed: true, Expected: expected, Actual: actual},
	}
}

func TestValidateDuplicateKeys(t *testing.T) {
	t.Parallel()
	natural := backfill.DuplicateKeys{Name: "natural_key", Columns: []string{"order_no"}}
	across := backfill.DuplicateKeys{Name: "natural_key_across", Columns: []string{"order_no"}, AcrossTarget: true}

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		job := s.job(natural, across, backfill.DuplicateKeys{})
		rep, vs, err := s.run(t, job)
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("natural_key", "0 duplicate keys", "0 duplicate keys"), vs, "natural_key")
		requireEvidence(t, passing("natural_key_across", "0 duplicate keys", "0 duplicate keys"), vs, "natural_key_across")
		requireEvidence(t, passing("duplicate_keys", "0 duplicate keys", "0 duplicate keys"), vs, "duplicate_keys")
		require.Equal(t, map[string]any{"columns": []any{"id"}, "duplicate_keys": 0.0, "across_target": false,
			"chunk_rows": "ChunkColumn sold_at in [2024-03-01T00:00:00Z, 2024-03-02T00:00:00Z) UTC 24h0m0s"},
			detailOf(t, vs, "duplicate_keys", chunkDay1))
	})

	t.Run("InChunk", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		s.rows[4].OrderNo = "o-3" // id 5 repeats id 3's order number on day 1
		rep, vs, err := s.run(t, s.job(natural))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "natural_key", Expected: "0 duplicate keys", Actual: "1 duplicate keys",
			Sample: []string{"(o-3): 2 rows"}}}, vs, "natural_key")
		var n int
		require.NoError(t, s.db.Get(&n, `SELECT count(*) FROM sales`))
		require.Zero(t, n, "the failed chunk rolled back")
	})

	t.Run("NullsAreNotDuplicates", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		job := s.job(natural)
		inner := job.Extractor
		job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
			if c.Start.Equal(day1) {
				for id := int64(100); id < 103; id++ {
					if err := w.Write(ctx, id, nil, day1, "EU", nil, nil, nil); err != nil {
						return err
					}
				}
			}
			return inner.Extract(ctx, c, w)
		})
		rep, vs, err := s.run(t, job)
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("natural_key", "0 duplicate keys", "0 duplicate keys"), vs, "natural_key")
	})

	t.Run("AcrossChunks", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		s.rows[19].OrderNo = "o-3" // id 20 on day 2 repeats id 3 of day 1
		rep, vs, err := s.run(t, s.job(natural, across))
		requirePaused(t, rep, err)
		requireEvidence(t, passing("natural_key", "0 duplicate keys", "0 duplicate keys"), vs, "natural_key")
		requireEvidence(t, []evidence{
			{Chunk: chunkDay1, Check: "natural_key_across", Passed: true, Expected: "0 duplicate keys", Actual: "0 duplicate keys"},
			{Chunk: chunkDay2, Check: "natural_key_across", Expected: "0 duplicate keys", Actual: "1 duplicate keys", Sample: []string{"(o-3): 2 rows"}},
		}, vs, "natural_key_across")
	})

	t.Run("WithoutChunkColumn", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		s.rows[4].OrderNo = "o-3"
		job := s.job(natural)
		job.ChunkColumn = ""
		rep, vs, err := s.run(t, job)
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "natural_key", Expected: "0 duplicate keys", Actual: "1 duplicate keys",
			Sample: []string{"(o-3): 2 rows"}}}, vs, "natural_key")
		require.Equal(t, "identities in staging", detailOf(t, vs, "natural_key", chunkDay1)["chunk_rows"])
	})
}

func TestValidateCompleteness(t *testing.T) {
	t.Parallel()
	full := backfill.Completeness{CompareContent: true}
	const (
		wantFull = "0 staged rows missing from target; 0 rows with other content; 0 target rows missing from staging"
		want     = "0 staged rows missing from target; 0 target rows missing from staging"
	)

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		exact := backfill.Completeness{Name: "exact", CompareContent: true, Exact: true}
		rep, vs, err := s.run(t, s.job(full, exact))
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("completeness", wantFull, wantFull), vs, "completeness")
		requireEvidence(t, passing("exact", wantFull, wantFull), vs, "exact")
		want := map[string]any{"rejected": 0.0, "staged_missing_from_target": 0.0, "differing": 0.0,
			"target_missing_from_staging": 0.0, "content_columns": []any{"order_no", "sold_at", "region", "customer_id", "amount", "qty"},
			"method": "exact"}
		require.Equal(t, want, detailOf(t, vs, "exact", chunkDay1), "lineage columns are not content")
		// Without Exact the fingerprints prove the same: equal rows.
		d := detailOf(t, vs, "completeness", chunkDay1)
		fp := d["fingerprint"].(map[string]any)
		delete(d, "fingerprint")
		want["method"] = "fingerprint"
		require.Equal(t, want, d)
		require.Equal(t, true, fp["equal"])
		require.Equal(t, []any{"id", "order_no", "sold_at", "region", "customer_id", "amount", "qty"}, fp["columns"])
		require.Equal(t, fp["staged"], fp["target"])
		require.Equal(t, 12.0, fp["staged"].(map[string]any)["rows"])
	})

	t.Run("StagedRowMissingFromTarget", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(sabotage(`DELETE FROM sales WHERE id IN (7, 2)`), full))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "completeness", Expected: wantFull,
			Actual: "2 staged rows missing from target; 0 rows with other content; 0 target rows missing from staging",
			Sample: []string{"not in target: (2)", "not in target: (7)"}}}, vs, "completeness")
	})

	t.Run("TargetRowMissingFromStaging", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, _, err := s.run(t, s.job(full))
		requireCompleted(t, rep, err)
		// The source no longer has id 15 (day 2).
		s.rows = slices.DeleteFunc(s.rows, func(r sale) bool { return r.ID == 15 })
		job := s.job(full)
		job.NewRun = true
		rep, vs, err := s.run(t, job)
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{
			{Chunk: chunkDay1, Check: "completeness", Passed: true, Expected: wantFull, Actual: wantFull},
			{Chunk: chunkDay2, Check: "completeness", Expected: wantFull,
				Actual: "0 staged rows missing from target; 0 rows with other content; 1 target rows missing from staging",
				Sample: []string{"not in staging: (15)"}},
		}, vs, "completeness")

		// Without a ChunkColumn the target's rows of a chunk are unknown:
		// that direction is skipped, and said so.
		job.ChunkColumn = ""
		job.Name = "sales-no-chunk-column"
		rep, vs, err = s.run(t, job)
		requireCompleted(t, rep, err)
		const skipped = "0 staged rows missing from target; 0 rows with other content; target rows not checked (no ChunkColumn)"
		requireEvidence(t, passing("completeness", skipped, skipped), vs, "completeness")
		require.Equal(t, "skipped: Job.ChunkColumn is not set, so the chunk's target rows are unknown",
			detailOf(t, vs, "completeness", chunkDay2)["target_to_staging"])
	})

	t.Run("ContentDiffers", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(sabotage(`UPDATE sales SET amount = amount + 1, order_no = NULL WHERE id = 3`),
			backfill.Completeness{Name: "identity_only"}, full))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "identity_only", Passed: true, Expected: want, Actual: want}},
			vs, "identity_only")
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "completeness", Expected: wantFull,
			Actual: "0 staged rows missing from target; 1 rows with other content; 0 target rows missing from staging",
			Sample: []string{"differs: (3): order_no, amount"}}}, vs, "completeness")
	})

	t.Run("TargetWinsKeepsContent", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		job := s.job(full, backfill.Sample{})
		job.Target.Conflict = backfill.TargetWins
		rep, _, err := s.run(t, job)
		requireCompleted(t, rep, err)
		for i := range s.rows {
			s.rows[i].Amount = "0.00" // the source changed; the target wins
		}
		job.NewRun = true
		rep, vs, err := s.run(t, job)
		requireCompleted(t, rep, err)
		require.Equal(t, int64(24), rep.Counts.Unchanged)
		requireEvidence(t, passing("completeness", wantFull, wantFull), vs, "completeness")
		require.Equal(t, "not compared: the target wins every conflict (TargetWins)", detailOf(t, vs, "completeness", chunkDay1)["content"])
		require.Equal(t, "not compared: the target wins every conflict (TargetWins)", detailOf(t, vs, "sample", chunkDay1)["content"])
	})

	t.Run("NewerVersionWins", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		// qty is the version: a staged row with a lower qty loses.
		job := s.job(full, backfill.Sample{})
		job.Target.Conflict = backfill.NewerVersionWins
		job.Target.Version = "qty"
		rep, _, err := s.run(t, job)
		requireCompleted(t, rep, err)
		for i := range s.rows {
			s.rows[i].Qty--
			s.rows[i].Amount = "0.00"
		}
		job.NewRun = true
		job.Validators = append(job.Validators, sabotage(`UPDATE sales SET qty = qty - 5, amount = 99 WHERE id = 4`))
		job.Validators = append(job.Validators, backfill.Completeness{Name: "after", CompareContent: true}, backfill.Sample{Name: "sample_after"})
		rep, vs, err := s.run(t, job)
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "completeness", Passed: true, Expected: wantFull, Actual: wantFull}},
			vs, "completeness")
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "after", Expected: wantFull,
			Actual: "0 staged rows missing from target; 1 rows with other content; 0 target rows missing from staging",
			Sample: []string{"differs: (4): amount, qty"}}}, vs, "after")
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "sample_after", Expected: "0 of 12 sampled rows differ",
			Actual: "1 of 12 sampled rows differ", Sample: []string{"(4): amount, qty"}}}, vs, "sample_after")
	})
}

func TestValidateReferentialIntegrity(t *testing.T) {
	t.Parallel()
	ri := backfill.ReferentialIntegrity{Columns: []string{"customer_id"}, ParentTable: "public.customers", ParentColumns: []string{"id"}}

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		s.rows[8].Customer = nil // a NULL reference is not an orphan
		rep, vs, err := s.run(t, s.job(ri))
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("referential_integrity", "0 orphan rows", "0 orphan rows"), vs, "referential_integrity")
	})

	t.Run("Orphan", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		s.rows[8].Customer = int64(42)
		s.rows[10].Customer = int64(43)
		rep, vs, err := s.run(t, s.job(ri))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "referential_integrity", Expected: "0 orphan rows", Actual: "2 orphan rows",
			Sample: []string{"(9) -> (42)", "(11) -> (43)"}}}, vs, "referential_integrity")
	})

	t.Run("Config", func(t *testing.T) {
		t.Parallel()
		scope := backfill.ValidationScope{Staging: "pg_temp.x", Info: backfill.TableInfo{Target: backfill.Target{Table: "t", Key: []string{"id"}}}}
		for _, v := range []backfill.ReferentialIntegrity{
			{ParentTable: "p"},
			{Columns: []string{"a"}},
			{Columns: []string{"a"}, ParentTable: "p", ParentColumns: []string{"x", "y"}},
		} {
			_, err := v.Validate(context.Background(), nil, scope)
			require.ErrorIs(t, err, backfill.ErrInvalidConfig, "%+v", v)
		}
	})
}

func TestValidateAggregates(t *testing.T) {
	t.Parallel()
	agg := backfill.Aggregates{Day: "sold_at", Dimensions: []string{"region"},
		Measures: []backfill.Measure{{Column: "amount"}, {Column: "qty"}}}
	const (
		want   = "0 differing groups"
		proven = "0 differing groups (staged and target rows equal by fingerprint)"
	)

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		exact := agg
		exact.Name, exact.Exact = "exact", true
		rep, vs, err := s.run(t, s.job(agg, exact, backfill.Aggregates{Name: "counts", Exact: true}))
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("aggregates", want, proven), vs, "aggregates")
		requireEvidence(t, passing("exact", want, "0 of 2 groups differ"), vs, "exact")
		requireEvidence(t, passing("counts", want, "0 of 1 groups differ"), vs, "counts")
		require.Equal(t, map[string]any{"group_by": []any{"day(sold_at)", "region"}, "measures": []any{"amount", "qty"},
			"tolerances": map[string]any{"amount": 0.0, "qty": 0.0}, "zone": "UTC", "groups": 2.0, "differing": 0.0, "differences": []any{},
			"method": "exact"},
			detailOf(t, vs, "exact", chunkDay1))
		d := detailOf(t, vs, "aggregates", chunkDay1)
		require.Equal(t, "fingerprint", d["method"])
		require.NotContains(t, d, "groups", "the fingerprints prove equal groups without computing them")
	})

	t.Run("ShiftedSum", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		// id 4 is in day 1, region EU (even ids): EU sums 2.5+4.5+...+12.5 = 45.00.
		rep, vs, err := s.run(t, s.job(sabotage(`UPDATE sales SET amount = amount + 10 WHERE id = 4`), agg))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "aggregates", Expected: want, Actual: "1 of 2 groups differ",
			Sample: []string{"(2024-03-01,EU): sum(amount) staged 45.00 target 55.00"}}}, vs, "aggregates")
		d := detailOf(t, vs, "aggregates", chunkDay1)
		require.Equal(t, []any{map[string]any{"group": "(2024-03-01,EU)",
			"staged": map[string]any{"count": 6.0, "sums": map[string]any{"amount": "45.00", "qty": "42"}, "nulls": map[string]any{"amount": 0.0, "qty": 0.0}},
			"target": map[string]any{"count": 6.0, "sums": map[string]any{"amount": "55.00", "qty": "42"}, "nulls": map[string]any{"amount": 0.0, "qty": 0.0}},
		}}, d["differences"])
	})

	t.Run("WithinTolerance", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		tolerant := backfill.Aggregates{Day: "sold_at", Dimensions: []string{"region"},
			Measures: []backfill.Measure{{Column: "amount", Tolerance: 0.01}, {Column: "qty"}}}
		rep, vs, err := s.run(t, s.job(sabotage(`UPDATE sales SET amount = amount + 0.01 WHERE id = 4`), tolerant))
		requireCompleted(t, rep, err)
		// Day 1's rows differ, so its groups are computed; day 2's are
		// equal.
		requireEvidence(t, []evidence{
			{Chunk: chunkDay1, Check: "aggregates", Passed: true, Expected: want, Actual: "0 of 2 groups differ"},
			{Chunk: chunkDay2, Check: "aggregates", Passed: true, Expected: want, Actual: proven},
		}, vs, "aggregates")
	})

	t.Run("GroupMissingOnOneSideAndNulls", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(sabotage(`UPDATE sales SET region = 'XX' WHERE id = 4; UPDATE sales SET qty = NULL WHERE id = 5`), agg))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "aggregates", Expected: want, Actual: "3 of 3 groups differ",
			Sample: []string{
				"(2024-03-01,EU): count staged 6 target 5, sum(amount) staged 45.00 target 40.50, sum(qty) staged 42 target 38",
				"(2024-03-01,US): sum(qty) staged 36 target 31, nulls(qty) staged 0 target 1",
				"(2024-03-01,XX): count staged 0 target 1, sum(amount) staged NULL target 4.50, sum(qty) staged NULL target 4",
			}}}, vs, "aggregates")
	})

	t.Run("DayInZone", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		ny, err := time.LoadLocation("America/New_York")
		require.NoError(t, err)
		s.zone, s.from = ny, time.Date(2024, 3, 1, 0, 0, 0, 0, ny)
		// 23:30 in New York is the next day in UTC.
		s.rows = []sale{
			{ID: 1, SoldAt: time.Date(2024, 3, 1, 23, 30, 0, 0, ny), Region: "EU", Amount: "1.00", Qty: 1},
			{ID: 2, SoldAt: time.Date(2024, 3, 2, 0, 30, 0, 0, ny), Region: "EU", Amount: "2.00", Qty: 2},
		}
		job := s.job(sabotageIn("time:2024-03-01T00:00:00-05:00/2024-03-02T00:00:00-05:00", `UPDATE sales SET amount = amount + 5 WHERE id = 1`),
			backfill.Aggregates{Day: "sold_at", Measures: []backfill.Measure{{Column: "amount"}}})
		rep, vs, err := s.run(t, job)
		requirePaused(t, rep, err)
		ev := evidenceOf(vs, "aggregates")
		require.Len(t, ev, 1)
		require.Equal(t, []string{"(2024-03-01): sum(amount) staged 1.00 target 6.00"}, ev[0].Sample)
	})

	t.Run("Config", func(t *testing.T) {
		t.Parallel()
		scope := backfill.ValidationScope{Staging: "pg_temp.x", Info: backfill.TableInfo{
			Target:  backfill.Target{Table: "t", Key: []string{"id"}},
			Columns: []backfill.Column{{Name: "id", BaseType: "int8", Key: true}, {Name: "name", BaseType: "text"}, {Name: "at", BaseType: "timestamptz"}}}}
		for _, v := range []backfill.Aggregates{
			{Dimensions: []string{"nope"}},
			{Measures: []backfill.Measure{{Column: "nope"}}},
			{Day: "name"},
			{Measures: []backfill.Measure{{Column: "id", Tolerance: -1}}},
		} {
			_, err := v.Validate(context.Background(), nil, scope)
			require.ErrorIs(t, err, backfill.ErrInvalidConfig, "%+v", v)
		}
		scope.Zone = time.Local
		_, err := backfill.Aggregates{Day: "at"}.Validate(context.Background(), nil, scope)
		require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	})
}

func TestValidateReplayChangesNothing(t *testing.T) {
	t.Parallel()
	const want = "0 inserted, 0 updated, 0 closed"

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(backfill.ReplayChangesNothing{}, backfill.ReplayChangesNothing{Name: "exact", Exact: true}))
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("replay_changes_nothing", want, want), vs, "replay_changes_nothing")
		requireEvidence(t, passing("exact", want, want), vs, "exact")
		require.Equal(t, map[string]any{"inserted": 0.0, "updated": 0.0, "unchanged": 12.0, "closed": 0.0, "method": "exact"},
			detailOf(t, vs, "exact", chunkDay1))
		d := detailOf(t, vs, "replay_changes_nothing", chunkDay1)
		require.Equal(t, "fingerprint", d["method"])
		delete(d, "fingerprint")
		require.Equal(t, map[string]any{"inserted": 0.0, "updated": 0.0, "unchanged": 12.0, "closed": 0.0, "method": "fingerprint"}, d)
	})

	t.Run("MergeNotIdempotent", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		// A trigger that normalises region: the stored row never equals the
		// staged one, so every replay rewrites it.
		_, err := s.db.Exec(`
			CREATE FUNCTION upper_region() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN NEW.region := upper(NEW.region); RETURN NEW; END $$;
			CREATE TRIGGER upper_region BEFORE INSERT OR UPDATE ON sales FOR EACH ROW EXECUTE FUNCTION upper_region()`)
		require.NoError(t, err)
		for i := range s.rows {
			s.rows[i].Region = strings.ToLower(s.rows[i].Region)
		}
		rep, vs, err := s.run(t, s.job(backfill.ReplayChangesNothing{Severity: backfill.SeverityWarn}, backfill.ReplayChangesNothing{Name: "replay_gate"}))
		requirePaused(t, rep, err)
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "replay_changes_nothing", Expected: want, Actual: "0 inserted, 12 updated, 0 closed"}},
			vs, "replay_changes_nothing")
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "replay_gate", Expected: want, Actual: "0 inserted, 12 updated, 0 closed"}},
			vs, "replay_gate")
		require.Equal(t, backfill.SeverityWarn, vs[0].Severity)
		require.Equal(t, backfill.SeverityError, vs[1].Severity)
	})

	t.Run("NotAReplayer", func(t *testing.T) {
		t.Parallel()
		_, err := backfill.ReplayChangesNothing{}.Validate(context.Background(), nil, backfill.ValidationScope{Stager: noReplayStager{}})
		require.ErrorIs(t, err, backfill.ErrUnsupported)
	})
}

type noReplayStager struct{}

func (noReplayStager) Add(context.Context, int64, []any) error { return nil }
func (noReplayStager) Merge(context.Context) (backfilltype.MergeResult, error) {
	return backfilltype.MergeResult{}, nil
}
func (noReplayStager) Close() error { return nil }

func TestValidateSample(t *testing.T) {
	t.Parallel()

	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(backfill.Sample{}))
		requireCompleted(t, rep, err)
		requireEvidence(t, passing("sample", "0 of 12 sampled rows differ", "0 of 12 sampled rows differ"), vs, "sample")
	})

	t.Run("Differences", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		rep, vs, err := s.run(t, s.job(sabotage(`UPDATE sales SET qty = qty + 1, amount = NULL WHERE id = 6; DELETE FROM sales WHERE id = 8`), backfill.Sample{}))
		requirePaused(t, rep, err)
		// The sample's order: md5 of the identity text and the seed.
		requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "sample", Expected: "0 of 12 sampled rows differ", Actual: "2 of 12 sampled rows differ",
			Sample: sampleOrder(0, []string{"(6): amount, qty", "(8): not in target"})}}, vs, "sample")
	})

	t.Run("DeterministicBySeed", func(t *testing.T) {
		t.Parallel()
		s := newSales(t)
		every := sabotageIn("", `UPDATE sales SET qty = -qty`)
		rep, vs, err := s.run(t, s.job(every, backfill.Sample{N: 3, Seed: 7, Severity: backfill.SeverityWarn},
			backfill.Sample{Name: "again", N: 3, Seed: 7, Severity: backfill.SeverityWarn}, backfill.Sample{Name: "other", N: 3, Seed: 8, Severity: backfill.SeverityWarn}))
		requireCompleted(t, rep, err)
		var all []string
		for id := 1; id <= 12; id++ {
			all = append(all, fmt.Sprintf("(%d): qty", id))
		}
		sample, again, other := evidenceOf(vs, "sample")[0], evidenceOf(vs, "again")[0], evidenceOf(vs, "other")[0]
		require.Equal(t, sampleOrder(7, all)[:3], sample.Sample)
		require.Equal(t, sample.Sample, again.Sample)
		require.Equal(t, sampleOrder(8, all)[:3], other.Sample)
		require.NotEqual(t, sample.Sample, other.Sample)
		require.Equal(t, "3 of 3 sampled rows differ", sample.Actual)
	})

	t.Run("Config", func(t *testing.T) {
		t.Parallel()
		scope := backfill.ValidationScope{Staging: "pg_temp.x", Info: backfill.TableInfo{Target: backfill.Target{Table: "t", Key: []string{"id"}}}}
		_, err := backfill.Sample{N: -1}.Validate(context.Background(), nil, scope)
		require.ErrorIs(t, err, backfill.ErrInvalidConfig)
	})
}

// sampleOrder orders "(id): ..." entries as Sample picks rows: by
// md5("(id)" || seed).
func sampleOrder(seed int64, entries []string) []string {
	key := func(e string) string {
		sum := md5.Sum([]byte(e[:strings.Index(e, ":")] + fmt.Sprint(seed)))
		return hex.EncodeToString(sum[:])
	}
	out := slices.Clone(entries)
	slices.SortFunc(out, func(a, b string) int { return strings.Compare(key(a), key(b)) })
	return out
}

func TestValidateExceptionRate(t *testing.T) {
	t.Parallel()
	s := newSales(t)
	job := s.job(backfill.CheckExceptionRate{Name: "lenient", MaxRate: 0.2}, backfill.CheckExceptionRate{MaxRate: 0.1})
	inner := job.Extractor
	job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
		if c.Start.Equal(day1) {
			for i := range 2 {
				if err := w.Reject(ctx, map[string]any{"line": i}, "", "unreadable"); err != nil {
					return err
				}
			}
		}
		return inner.Extract(ctx, c, w)
	})
	rep, vs, err := s.run(t, job)
	requirePaused(t, rep, err)
	requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "lenient", Passed: true, Expected: "rejected/read <= 0.2", Actual: "0.14285714285714285 (2 of 14 rows rejected)"}},
		vs, "lenient")
	requireEvidence(t, []evidence{{Chunk: chunkDay1, Check: "exception_rate", Expected: "rejected/read <= 0.1", Actual: "0.14285714285714285 (2 of 14 rows rejected)"}},
		vs, "exception_rate")

	// No database needed; the zero value allows no rejects.
	res, err := backfill.CheckExceptionRate{}.Validate(context.Background(), nil, backfill.ValidationScope{Counts: backfill.Counts{Read: 1000, Rejected: 1}})
	require.NoError(t, err)
	require.False(t, res.Passed)
	res, err = backfill.CheckExceptionRate{}.Validate(context.Background(), nil, backfill.ValidationScope{})
	require.NoError(t, err)
	require.True(t, res.Passed, "a chunk that read nothing passes")
	_, err = backfill.CheckExceptionRate{MaxRate: 1.5}.Validate(context.Background(), nil, backfill.ValidationScope{})
	require.ErrorIs(t, err, backfill.ErrInvalidConfig)
}

// TestValidateNeedsStaging: the SQL checks refuse a scope without a
// staging table (the fakes) rather than pass.
func TestValidateNeedsStaging(t *testing.T) {
	t.Parallel()
	scope := backfill.ValidationScope{Info: backfill.TableInfo{Target: backfill.Target{Table: "t", Key: []string{"id"}}}}
	for _, v := range []backfill.Validator{
		backfill.DuplicateKeys{}, backfill.Completeness{}, backfill.Aggregates{}, backfill.Sample{},
		backfill.ReferentialIntegrity{Columns: []string{"a"}, ParentTable: "p"},
	} {
		_, err := v.Validate(context.Background(), nil, scope)
		require.ErrorIs(t, err, backfill.ErrUnsupported, "%T", v)
	}
}

// TestValidateCleanInEveryMode: on clean data every check passes in every
// merge mode, on the first load and on its replay (identities with
// ValidFrom, derived keys, hash and ingestion columns, date days).
func TestValidateCleanInEveryMode(t *testing.T) {
	t.Parallel()
	const lineage = `, backfill_inserted_by bigint, backfill_updated_by bigint`
	cases := []struct {
		name, ddl string
		target    backfill.Target
		chunker   backfill.Chunker
		chunkCol  string
		day       string
		rows      [][]any
	}{
		{name: "UpsertHashIngested",
			ddl: `CREATE TABLE t (id bigint PRIMARY KEY, name text, amount numeric(10,2), row_hash bytea, ingested_at timestamptz` + lineage + `)`,
			target: backfill.Target{Table: "t", Key: []string{"id"}, Columns: []string{"id", "name", "amount"},
				HashColumn: "row_hash", IngestedAt: "ingested_at"},
			chunker: backfill.IntRange(0, 20, 10), chunkCol: "id",
			rows: [][]any{{int64(1), "a", "1.00"}, {int64(2), nil, nil}, {int64(15), "c", "3.50"}}},
		{name: "AppendOnly",
			ddl:     `CREATE TABLE t (event_id text PRIMARY KEY, at timestamptz, amount numeric(10,2)` + lineage + `)`,
			target:  backfill.Target{Table: "t", Key: []string{"event_id"}, Columns: []string{"event_id", "at", "amount"}, Mode: backfill.AppendOnly},
			chunker: backfill.List("file-1"), day: "at",
			rows: [][]any{{"e1", day1, "1.00"}, {"e2", day1.Add(time.Hour), "-2.00"}, {"e1", day1, "1.0"}}},
		{name: "History",
			ddl:     `CREATE TABLE t (sku text, valid_from date, valid_to date, amount numeric(10,2)` + lineage + `, PRIMARY KEY (sku, valid_from))`,
			target:  backfill.Target{Table: "t", Key: []string{"sku"}, Columns: []string{"sku", "valid_from", "amount"}, Mode: backfill.History},
			chunker: backfill.List("prices"), day: "valid_from",
			rows: [][]any{{"a", "2024-01-01", "1.00"}, {"a", "2024-02-01", "2.00"}, {"b", "2024-01-01", nil}}},
		{name: "Keyless",
			ddl: `CREATE TABLE t (person_key text PRIMARY KEY, name text, amount numeric(10,2)` + lineage + `)`,
			target: backfill.Target{Table: "t", Key: []string{"person_key"}, Columns: []string{"name", "amount"}, Mode: backfill.Keyless,
				Derive: []backfill.KeyRule{{Column: "person_key", From: "name", Rules: []backfill.Normalizer{backfill.Trim, backfill.CaseFold}}}},
			chunker: backfill.List("people.csv"),
			rows:    [][]any{{"Ann ", "1.00"}, {"BOB", "2.00"}, {"ann", "1.00"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			_, err := db.Exec(tc.ddl)
			require.NoError(t, err)
			job := backfill.Job{Name: tc.name, Chunker: tc.chunker, Extractor: rowsFunc(tc.rows...), Target: tc.target, ChunkColumn: tc.chunkCol,
				Validators: []backfill.Validator{
					backfill.DuplicateKeys{}, backfill.Completeness{CompareContent: true}, backfill.ReplayChangesNothing{}, backfill.Sample{},
					backfill.Aggregates{Day: tc.day, Measures: []backfill.Measure{{Column: "amount"}}}, backfill.CheckExceptionRate{},
					// The same three checks without the fingerprint shortcut.
					backfill.Completeness{Name: "completeness_exact", CompareContent: true, Exact: true},
					backfill.ReplayChangesNothing{Name: "replay_exact", Exact: true},
					backfill.Aggregates{Name: "aggregates_exact", Day: tc.day, Measures: []backfill.Measure{{Column: "amount"}}, Exact: true},
				}}
			if tc.chunkCol != "" {
				job.Extractor = backfill.ExtractorFunc(func(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
					for _, r := range tc.rows {
						if c.Contains(r[0]) {
							if err := w.Write(ctx, r...); err != nil {
								return err
							}
						}
					}
					return nil
				})
			}
			r, err := backfill.New(db, nil)
			require.NoError(t, err)
			for _, replay := range []bool{false, true} {
				job.NewRun = replay
				rep, err := r.Run(context.Background(), job)
				require.NoError(t, err)
				require.Equal(t, backfill.RunCompleted, rep.Status)
				if replay {
					require.Zero(t, rep.Counts.Inserted+rep.Counts.Updated, "%+v", rep.Counts)
				}
				vs, err := backfill.NewPGManifest("").Validations(context.Background(), db, rep.BatchID)
				require.NoError(t, err)
				require.Len(t, vs, 9*rep.ChunksTotal)
				methods := map[string]string{}
				for _, v := range vs {
					require.True(t, v.Passed, "%s %s: expected %s, got %s %v %s", v.ChunkID, v.Check, v.Expected, v.Actual, v.Sample, v.Detail)
					var d struct {
						Method string `json:"method"`
					}
					if v.Detail != nil {
						require.NoError(t, json.Unmarshal(v.Detail, &d))
					}
					if d.Method != "" {
						methods[v.Check] = d.Method
					}
				}
				// Clean chunks take the fingerprint shortcut; History replays.
				replayMethod := "fingerprint"
				if tc.target.Mode == backfill.History {
					replayMethod = "exact"
				}
				require.Equal(t, map[string]string{"completeness": "fingerprint", "replay_changes_nothing": replayMethod, "aggregates": "fingerprint",
					"completeness_exact": "exact", "replay_exact": "exact", "aggregates_exact": "exact"}, methods)
			}
		})
	}
}

// TestValidateRestoresPlannerSettings: checks that allow hash joins for
// their own queries leave the merge's planner settings as they were.
func TestValidateRestoresPlannerSettings(t *testing.T) {
	t.Parallel()
	s := newSales(t)
	settings := backfill.ValidatorFunc(func(ctx context.Context, tx sqlx.ExtContext, sc backfill.ValidationScope) (backfill.CheckResult, error) {
		var got string
		err := sqlx.GetContext(ctx, tx, &got, `SELECT current_setting('enable_hashjoin') || ',' || current_setting('enable_mergejoin')`)
		return backfill.CheckResult{Check: "settings", Passed: got == "off,off", Expected: "off,off", Actual: got}, err
	})
	rep, vs, err := s.run(t, s.job(settings, backfill.Completeness{CompareContent: true}, backfill.Aggregates{}, backfill.ReplayChangesNothing{},
		backfill.DuplicateKeys{AcrossTarget: true},
		backfill.ReferentialIntegrity{Columns: []string{"customer_id"}, ParentTable: "customers", ParentColumns: []string{"id"}}, settings))
	requireCompleted(t, rep, err)
	requireEvidence(t, []evidence{
		{Chunk: chunkDay1, Check: "settings", Passed: true, Expected: "off,off", Actual: "off,off"},
		{Chunk: chunkDay1, Check: "settings", Passed: true, Expected: "off,off", Actual: "off,off"},
		{Chunk: chunkDay2, Check: "settings", Passed: true, Expected: "off,off", Actual: "off,off"},
		{Chunk: chunkDay2, Check: "settings", Passed: true, Expected: "off,off", Actual: "off,off"},
	}, vs, "settings")
}
