package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/pgbackfill/backfill"
	"github.com/pgbackfill/backfill/backfillthrottle"
	"github.com/pgbackfill/backfill/backfilltype"
	"github.com/pgbackfill/backfill/examples/internal/cli"
)

// The flights data as a graph of three modules (-graph): airports (the
// airports job, one chunk), then flights (the per-day flights job,
// essential), then route_stats (daily statistics per route read back
// from the flights table, deferrable), one frozen plan with
// backfill.Runner.RunGraph. A route_stats day runs only once the same
// day of flights is committed; under a throttle's hold route_stats parks
// while flights goes on.

const (
	graphName     = "flights-graph"
	routeStatsJob = "route-stats"
	// routeStatsSrc names route_stats's source: the flights target table.
	routeStatsSrc = "table flights (loaded by job " + flightsJob + ")"
	// routeStatsVersion is the version of RouteStats's query: part of
	// the route_stats job's plan fingerprint.
	routeStatsVersion = "route-stats/1"
)

// routeStatsDDL creates route_stats; idempotent, as schemaDDL.
const routeStatsDDL = `
SELECT pg_advisory_xact_lock(hashtext('backfill flights demo DDL'));
CREATE TABLE IF NOT EXISTS route_stats (
	day         date       NOT NULL,
	origin      varchar(3) NOT NULL,
	destination varchar(3) NOT NULL,
	flights     integer    NOT NULL,
	no_delay    integer    NOT NULL,
	avg_delay   numeric(8,2),
	p50_delay   numeric(8,1),
	max_delay   integer,
	backfill_inserted_by bigint,
	backfill_updated_by  bigint,
	PRIMARY KEY (day, origin, destination)
);
COMMENT ON TABLE route_stats IS 'per civil day of departure and route: statistics of the flights table';
COMMENT ON COLUMN route_stats.no_delay IS 'flights without an arrival delay (cancelled or diverted in the BTS data)';
COMMENT ON COLUMN route_stats.avg_delay IS 'mean arrival delay in minutes of the flights with one';
COMMENT ON COLUMN route_stats.p50_delay IS 'median arrival delay in minutes (percentile_cont 0.5)';
`

// routeStatsColumns are route_stats's columns, in the order RouteStats
// writes them; its key is (day, origin, destination).
var (
	routeStatsColumns = []string{"day", "origin", "destination", "flights", "no_delay", "avg_delay", "p50_delay", "max_delay"}
	routeStatsKey     = []string{"day", "origin", "destination"}
)

// routeStatsQuery aggregates the flights that departed in the half-open
// civil range [$1, $2), one row per route. Every aggregate is exact
// (numeric), so that a chunk read again from unchanged flights writes the
// same values: a replay finds them unchanged.
const routeStatsQuery = `
SELECT origin, destination, count(*) AS flights, count(*) FILTER (WHERE delay IS NULL) AS no_delay,
	round(avg(delay), 2)::text AS avg_delay,
	(percentile_cont(0.5) WITHIN GROUP (ORDER BY delay))::numeric(8,1)::text AS p50_delay,
	max(delay) AS max_delay
FROM flights
WHERE dep_local >= $1::timestamp AND dep_local < $2::timestamp
GROUP BY origin, destination
ORDER BY origin, destination`

// RouteStats builds route_stats's rows of one day (a KindTime chunk whose
// bounds are civil midnights in UTC, as the flights job's) from the
// committed rows of the flights table, read through DB. It implements
// [backfill.Extractor].
type RouteStats struct {
	DB *sqlx.DB
}

// Extract writes one row per (day, origin, destination) of the flights
// that departed in [c.Start, c.End).
func (s RouteStats) Extract(ctx context.Context, c backfill.Chunk, w backfill.RowWriter) error {
	if c.Kind != backfilltype.KindTime {
		return fmt.Errorf("route_stats: extract: chunk %s is %s, want %s", c.ID, c.Kind, backfilltype.KindTime)
	}
	lo, err := civilBound(c.Start)
	if err != nil {
		return fmt.Errorf("route_stats: extract: chunk %s: %w", c.ID, err)
	}
	hi, err := civilBound(c.End)
	if err != nil {
		return fmt.Errorf("route_stats: extract: chunk %s: %w", c.ID, err)
	}
	day := c.Start.Format("2006-01-02")
	rows, err := s.DB.QueryxContext(ctx, routeStatsQuery, lo, hi)
	if err != nil {
		return fmt.Errorf("route_stats: chunk %s: read flights: %w", c.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			origin, dest    string
			flights, noDel  int64
			avg, p50        sql.NullString
			maxDelay        sql.NullInt64
			avgV, p50V, mxV any
		)
		if err := rows.Scan(&origin, &dest, &flights, &noDel, &avg, &p50, &maxDelay); err != nil {
			return fmt.Errorf("route_stats: chunk %s: %w", c.ID, err)
		}
		if avg.Valid {
			avgV = avg.String
		}
		if p50.Valid {
			p50V = p50.String
		}
		if maxDelay.Valid {
			mxV = maxDelay.Int64
		}
		if err := w.Write(ctx, day, origin, dest, flights, noDel, avgV, p50V, mxV); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("route_stats: chunk %s: read flights: %w", c.ID, err)
	}
	return nil
}

// civilBound is a chunk's bound as the civil timestamp it stands for.
func civilBound(t time.Time) (string, error) {
	if _, off := t.Zone(); off != 0 {
		return "", fmt.Errorf("bound %s has UTC offset %ds: chunk the days in time.UTC", t.Format(time.RFC3339), off)
	}
	return t.Format("2006-01-02 15:04:05.999999"), nil
}

// flightsGraph is the graph of the three modules: the flights job reads
// from flights over days, route_stats the flights table through db.
// approvers is the graph's approval policy (0: none).
func flightsGraph(db *sqlx.DB, flights backfill.Extractor, days backfill.Chunker, airportsPath string, approvers int) backfill.Graph {
	return backfill.Graph{
		Name:     graphName,
		Approval: backfill.ApprovalPolicy{Approvers: approvers},
		Modules: []backfill.Module{
			{Name: "airports", Priority: 2, Jobs: []backfill.Job{{
				Name:        airportsJob,
				Source:      airportsSrc,
				CodeVersion: codeVersion,
				Chunker:     backfill.List(filepath.Base(airportsPath)),
				Extractor:   Airports{Path: airportsPath},
				Target:      backfill.Target{Table: "airports", Key: []string{"iata"}, Columns: airportColumns},
			}}},
			{Name: "flights", DependsOn: []string{"airports"}, Priority: 1, Class: backfill.ModuleEssential, Jobs: []backfill.Job{{
				Name:        flightsJob,
				Source:      flightsSrc,
				CodeVersion: codeVersion,
				Chunker:     days,
				Extractor:   flights,
				Target:      backfill.Target{Table: "flights", Key: flightKey, Columns: flightColumns},
			}}},
			{Name: "route_stats", DependsOn: []string{"flights"}, Class: backfill.ModuleDeferrable, Jobs: []backfill.Job{{
				Name:        routeStatsJob,
				Source:      routeStatsSrc,
				CodeVersion: routeStatsVersion,
				Chunker:     days,
				Extractor:   RouteStats{DB: db},
				Target:      backfill.Target{Table: "route_stats", Key: routeStatsKey, Columns: routeStatsColumns},
			}}},
		},
	}
}

// graphRunner is the Runner of the graph's run: o.concurrency chunks at
// once, throttles (the priority benchmark's hold), and the options of a
// test (o.staleAfter: how soon a killed worker's chunk is taken over).
// With wait, RunGraph waits for the graph's run's approvals.
func graphRunner(db *sqlx.DB, logger *slog.Logger, o options, throttles []backfillthrottle.Throttle, wait bool) (*backfill.Runner, error) {
	cfg := &backfill.Config{
		Concurrency:   o.concurrency,
		Manifest:      backfill.NewPGManifest(""),
		Logger:        logger,
		Throttles:     throttles,
		WorkerID:      o.workerID,
		ReturnOnPause: !wait,
	}
	if o.staleAfter > 0 {
		cfg.HeartbeatInterval = o.staleAfter / 4
		cfg.StaleAfter = o.staleAfter
	}
	if o.throttleEvery > 0 {
		cfg.ThrottleInterval = o.throttleEvery
	}
	return backfill.New(db, cfg)
}

// graphLoad creates the tables (unless o.noCreate), prints the graph's
// blueprint, runs the graph and prints each module's progress. With
// o.approvers the graph's run awaits that many approvals: without
// o.waitApproval it returns backfill.ErrAwaitingApproval (the message
// says how to approve) having written nothing.
func graphLoad(ctx context.Context, out io.Writer, db *sqlx.DB, logger *slog.Logger, src backfill.Extractor, days backfill.Chunker, airportsPath string, o options) (backfill.GraphReport, error) {
	if !o.noCreate {
		if _, err := db.ExecContext(ctx, schemaDDL+routeStatsDDL); err != nil {
			return backfill.GraphReport{}, fmt.Errorf("create tables: %w", err)
		}
	}
	runner, err := graphRunner(db, logger, o, nil, false)
	if err != nil {
		return backfill.GraphReport{}, err
	}
	g := flightsGraph(db, src, days, airportsPath, o.approvers)
	bp, err := runner.GraphBlueprint(ctx, g)
	if err != nil {
		return backfill.GraphReport{}, err
	}
	fmt.Fprint(out, bp.Text())
	fmt.Fprintf(out, "graph %s: %s, concurrency %d\n", graphName, days.Scope(), o.concurrency)
	rep, err := runner.RunGraph(ctx, g)
	if errors.Is(err, backfill.ErrAwaitingApproval) {
		fmt.Fprintf(out, "graph %s: batch %d awaits approval of plan fingerprint %s; nothing is written until then\n", graphName, rep.BatchID, rep.Fingerprint)
		if !o.waitApproval {
			return rep, err
		}
		fmt.Fprintf(out, "  %v\n  waiting; each approver (an operator role other than this command's): backfill approve --job %s --fingerprint %s --reason TEXT\n",
			err, graphName, rep.Fingerprint)
		if runner, err = graphRunner(db, logger, o, nil, true); err != nil {
			return rep, err
		}
		rep, err = runner.RunGraph(ctx, g)
	}
	printModules(out, rep)
	if err != nil {
		return rep, cli.RunError(graphName, planFlag, err)
	}
	return rep, nil
}

// printModules prints one line per module of the graph's report.
func printModules(out io.Writer, rep backfill.GraphReport) {
	fmt.Fprintf(out, "graph %s: batch %d %s, %d chunks loaded by this call in %s\n", graphName, rep.BatchID, rep.Status, rep.Chunks, rep.Elapsed.Round(time.Millisecond))
	for _, m := range rep.Modules {
		line := fmt.Sprintf("  module %-12s %-10s %-10s chunks %d/%d  rows %d", m.Name, m.Class, m.State, m.ChunksDone, m.ChunksTotal, m.Rows)
		if m.Reason != "" && m.Reason != string(m.State) && m.State != backfilltype.ModuleCompleted {
			line += "  (" + m.Reason + ")"
		}
		fmt.Fprintln(out, line)
	}
}
