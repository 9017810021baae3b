package backfill

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/internal/pgstore"
	"github.com/pgbackfill/backfill/internal/pgtest"
)

// TestSkippedChunkRoundTrips counts the client's round trips per skipped
// chunk (Job.SkipUnchanged, an unchanged replay on the default path), as
// the difference between replays of 3 and of 13 chunks, divided by 10,
// like TestChunkRoundTrips. With -v it logs them. Each one is a wait for
// the server, on a network a millisecond or so.
func TestSkippedChunkRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.NewURL(t)
	pu, err := url.Parse(u)
	require.NoError(t, err)
	p := newTripProxy(t, pu.Host)
	pu.Host = p.ln.Addr().String()
	db, err := sqlx.Open("postgres", pu.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE live (id bigint PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	r, err := New(db, &Config{WorkerID: "trips"})
	require.NoError(t, err)

	run := func(name string, chunks int) map[string]int {
		job := liveJob(nil)
		job.Name, job.ChunkColumn, job.SkipUnchanged = name, "id", true
		job.Chunker = IntRange(0, int64(10*chunks), 10)
		_, err := r.Run(ctx, job)
		require.NoError(t, err)
		job.NewRun = true
		p.take()
		rep, err := r.Run(ctx, job)
		require.NoError(t, err)
		require.Equal(t, chunks, rep.ChunksSkipped)
		m := p.take()
		for q := range m {
			// Timed, not per chunk: the heartbeat, and the control state
			// read by the monitor (its transaction's BEGIN and COMMIT
			// stay counted: the bound below leaves room for them).
			if strings.Contains(q, "heartbeat_at") || strings.HasPrefix(q, "SELECT r.status, r.last_error") {
				delete(m, q)
			}
		}
		return m
	}
	run("warm", 1)
	few, many := run("few", 3), run("many", 13)
	var lines []string
	total := 0
	for q, n := range many {
		d := n - few[q]
		total += d
		if d != 0 {
			lines = append(lines, fmt.Sprintf("%5.1f %s", float64(d)/10, q))
		}
	}
	sort.Strings(lines)
	t.Logf("round trips per skipped chunk: %.1f\n%s", float64(total)/10, strings.Join(lines, "\n"))
	// 18 before the target fingerprint ran without its savepoint and
	// pinned settings when its hash reads none (hashReadsSettings).
	// The bound has half a round trip per chunk of room for the timed
	// reads' transactions on a busy machine (15.6 seen once).
	require.LessOrEqual(t, total, 10*15+5, "round trips per skipped chunk (x10)")
}

// TestTargetFingerprintIgnoresSessionSettings: a replay's target
// fingerprint is the same under any session settings that change how
// values print or parse, for a table whose hash reads no setting (run
// without pinning them, hashReadsSettings) and for one whose hash does
// (a date, a float, an interval and a bytea: pinned); and it equals the
// fingerprint a merged chunk records (targetFingerprintMerged, pinned),
// which is what a replay compares it with.
func TestTargetFingerprintIgnoresSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	db.MustExec(`CREATE TABLE sf (id bigint PRIMARY KEY, t text, v varchar(10), c char(3), n numeric(10,3), b bool, at timestamptz, ts timestamp, u uuid, i4 int);
		INSERT INTO sf SELECT i, 'τ' || i, 'v' || i, 'c', i * 1.125, i % 2 = 0, '2024-03-01 12:00:00.123456+05:30'::timestamptz + i * interval '1 day',
			'2024-03-01 12:00:00'::timestamp + i * interval '1 hour', md5(i::text)::uuid, NULLIF(i, 3) FROM generate_series(0, 19) i;
		CREATE TABLE ps (LIKE sf, d date, f float8, iv interval, by bytea, PRIMARY KEY (id));
		INSERT INTO ps SELECT sf.*, '2024-02-29'::date + id::int, id / 3.0, id * interval '1 day 2 hours', '\x00ff'::bytea FROM sf`)
	weird := `SELECT set_config('DateStyle', 'SQL, DMY', true), set_config('TimeZone', 'Asia/Kathmandu', true), set_config('extra_float_digits', '-3', true),
		set_config('IntervalStyle', 'sql_standard', true), set_config('bytea_output', 'escape', true)`
	for _, tc := range []struct {
		table string
		pin   bool
	}{{"sf", false}, {"ps", true}} {
		var info TableInfo
		require.NoError(t, pgstore.ReadTx(ctx, db, func(tx sqlx.ExtContext) error {
			var err error
			info, err = pgstore.NewMerger().Prepare(ctx, tx, Target{Table: tc.table, Key: []string{"id"}})
			return err
		}))
		c := Chunk{ID: "int:0/20", Kind: backfilltype.KindInt, Lo: 0, Hi: 20}
		pc, cols, err := pgstore.TargetFingerprintCheck(info, ValidationScope{Chunk: c, Info: info, ChunkColumn: "id", Staging: "-"})
		require.NoError(t, err)
		require.Equal(t, tc.pin, pgstore.HashReadsSettings(pc, cols), tc.table)
		of := func(settings string) pgstore.Fingerprint {
			var fp pgstore.Fingerprint
			require.NoError(t, pgstore.InTx(ctx, db, func(tx sqlx.ExtContext) error {
				if settings != "" {
					if _, err := tx.ExecContext(ctx, settings); err != nil {
						return err
					}
				}
				var err error
				fp, err = pgstore.TargetFingerprint(ctx, tx, info, "id", nil, c)
				return err
			}))
			return fp
		}
		plain := of("")
		require.Equal(t, int64(20), plain.Rows, tc.table)
		require.Equal(t, plain, of(weird), "%s: the fingerprint under other settings", tc.table)
		// What a merged chunk records of the same rows (staging holding
		// them), with its settings pinned.
		var merged pgstore.MergedFingerprint
		require.NoError(t, pgstore.InTx(ctx, db, func(tx sqlx.ExtContext) error {
			if _, err := tx.ExecContext(ctx, weird+`; CREATE TEMP TABLE st ON COMMIT DROP AS SELECT * FROM `+tc.table); err != nil {
				return err
			}
			var err error
			merged, err = pgstore.TargetFingerprintMerged(ctx, tx, pgstore.TargetFingerprintMergedParams{Info: info, ChunkColumn: "id", Zone: nil, Staging: "st", Chunk: c})
			return err
		}))
		require.Zero(t, merged.Stray, tc.table)
		require.Equal(t, plain, merged.Fingerprint, "%s: the fingerprint a merged chunk records", tc.table)
	}
}
