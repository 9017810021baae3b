// Package benchpg holds what the benchmark programs that run a backfill
// beside pgbench share (cmd/bench/lock, cmd/bench/probe): the
// pgbench connection flags of a URL, and pgbench's per-transaction logs
// (-l) read back into latencies, windows and percentiles, and the server
// they run against (Open).
package benchpg

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Conn returns pgbench's connection flags (-h, -p, -U and the database
// name) for a URL of the form postgres://user@host:port/db?params, as
// internal/pgtest gives.
func Conn(url string) []string {
	rest := strings.TrimPrefix(url, "postgres://")
	user, rest, _ := strings.Cut(rest, "@")
	hostport, rest, _ := strings.Cut(rest, "/")
	dbname, _, _ := strings.Cut(rest, "?")
	host, port, _ := strings.Cut(hostport, ":")
	user, _, _ = strings.Cut(user, ":")
	return []string{"-h", host, "-p", or(port, "5432"), "-U", user, or(dbname, "postgres")}
}

func or(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// Tx is one pgbench transaction: when it ended and its latency.
type Tx struct {
	End time.Time
	Lat time.Duration
}

// ReadLogs reads pgbench's per-transaction logs (-l, every file
// prefix.*): "client_id transaction_no time script_no time_epoch
// time_us", time in microseconds, time_epoch/time_us when the
// transaction ended. Malformed lines are skipped.
func ReadLogs(prefix string) ([]Tx, error) {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, err
	}
	var out []Tx
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 6 {
				continue
			}
			us, err1 := strconv.ParseInt(fs[2], 10, 64)
			sec, err2 := strconv.ParseInt(fs[4], 10, 64)
			usec, err3 := strconv.ParseInt(fs[5], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			out = append(out, Tx{End: time.Unix(sec, usec*1000), Lat: time.Duration(us) * time.Microsecond})
		}
		err = sc.Err()
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return out, nil
}

// Window returns, sorted, the latencies of the transactions that ended
// in [from, to).
func Window(ts []Tx, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, t := range ts {
		if !t.End.Before(from) && t.End.Before(to) {
			out = append(out, t.Lat)
		}
	}
	slices.Sort(out)
	return out
}

// Quantile is the p-quantile (0 < p <= 1, nearest rank) of sorted
// durations, 0 for none.
func Quantile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(math.Ceil(p*float64(len(sorted))))-1, len(sorted)-1)
	return sorted[max(i, 0)]
}

// Pct is Quantile formatted to 10 µs ("-" for none).
func Pct(sorted []time.Duration, p float64) string {
	if len(sorted) == 0 {
		return "-"
	}
	return Quantile(sorted, p).Round(10 * time.Microsecond).String()
}
