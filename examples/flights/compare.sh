#!/usr/bin/env bash
# Usage (from the repository root):
#   bash internal/pgtest/with-postgres.sh bash examples/flights/compare.sh [FLAG...]
#
# Loads the flights twice against the same server, as separate processes:
# first with the library (the flights program), then with the hand-written
# baseline (-baseline: temp table + COPY + INSERT ... ON CONFLICT per day,
# into flights_baseline), and prints a comparison. FLAGs (e.g.
# -limit-days 7, -concurrency 4) are passed to both runs. The binary is
# built first, so compile time is not measured. Needs DATABASE_URL, psql,
# and a database in which neither flights nor flights_baseline holds rows
# (both runs must be fresh loads for the figures to compare).
set -euo pipefail

if [[ -z "${DATABASE_URL:-}" ]]; then
	echo "compare.sh: DATABASE_URL is not set; run it as: bash internal/pgtest/with-postgres.sh bash examples/flights/compare.sh" >&2
	exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/flights-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT

q() { psql "$DATABASE_URL" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

for t in flights flights_baseline; do
	if [[ -n "$(q "SELECT to_regclass('$t')")" && "$(q "SELECT count(*) FROM (SELECT 1 FROM $t LIMIT 1) s")" != 0 ]]; then
		echo "compare.sh: table $t already holds rows: use an empty database (e.g. the throwaway server of internal/pgtest/with-postgres.sh)" >&2
		exit 1
	fi
done

[[ -f "$here/data/flights-3m.parquet" ]] || bash "$here/fetch-data.sh"
(cd "$here/.." && go build -o "$work/flights" ./flights)

# run NAME ARGS...: runs the binary, keeps its output, records its wall time.
run() {
	local name=$1
	shift
	echo "== $name: flights $*"
	local t0 t1
	t0=$(date +%s.%N)
	"$work/flights" -data "$here/data" "$@" | tee "$work/$name.out" | grep -v '^  \(batch\|baseline\) .*chunk '
	t1=$(date +%s.%N)
	echo "$t0 $t1" | awk '{ printf "%.3f\n", $2 - $1 }' >"$work/$name.wall"
	echo
}
run library "$@"
run baseline -baseline "$@"

# field NAME: "chunks rows seconds rows/s" from the "this call" line, then
# the peak RSS in kB.
field() {
	sed -n 's/^  this call  \([0-9]*\) chunks, \([0-9]*\) rows in \(.*\) = \([0-9]*\) rows\/s$/\1 \2 \3 \4/p' "$work/$1.out"
}
rss() { sed -n 's/^  memory     peak RSS \([0-9]*\) kB.*$/\1/p' "$work/$1.out"; }
read -r lc lr lt lrs <<<"$(field library)"
read -r bc br bt brs <<<"$(field baseline)"
lm=$(rss library)
bm=$(rss baseline)
lw=$(cat "$work/library.wall")
bw=$(cat "$work/baseline.wall")
nl=$(q "SELECT count(*) FROM flights")
nb=$(q "SELECT count(*) FROM flights_baseline")
diff=$(q "SELECT count(*) FROM ((SELECT dep_local, origin, destination, seq, delay, distance FROM flights
	EXCEPT ALL SELECT * FROM flights_baseline) UNION ALL (SELECT * FROM flights_baseline
	EXCEPT ALL SELECT dep_local, origin, destination, seq, delay, distance FROM flights)) d")

echo "== comparison (concurrency and days as passed: ${*:-defaults})"
printf '%-10s %7s %9s %12s %12s %10s %12s\n' "" chunks rows "load time" "rows/s" "peak RSS" "process wall"
printf '%-10s %7s %9s %12s %12s %10s %12s\n' library "$lc" "$lr" "$lt" "$lrs" "$lm kB" "${lw}s"
printf '%-10s %7s %9s %12s %12s %10s %12s\n' baseline "$bc" "$br" "$bt" "$brs" "$bm kB" "${bw}s"
awk -v l="$lrs" -v b="$brs" -v lm="$lm" -v bm="$bm" 'BEGIN {
	printf "library/baseline: rows/s %.2fx, peak RSS %.2fx\n", l / b, lm / bm }'
echo "target rows: flights $nl, flights_baseline $nb; rows differing between them: $diff"
echo "(load time: the flights job alone, as each program reports it; process wall also includes"
echo " start-up, the index scan and, for the library, the airports job and the summary queries)"
