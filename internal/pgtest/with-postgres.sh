#!/usr/bin/env bash
# Usage: internal/pgtest/with-postgres.sh COMMAND [ARG...]
#
# Runs COMMAND with DATABASE_URL pointing at a PostgreSQL server. When
# DATABASE_URL is already set, COMMAND simply runs against it. Otherwise a
# throwaway server is started with pgtmp (internal/pgtest/pgtmp), exported as
# DATABASE_URL for COMMAND, and stopped and removed afterwards, whatever
# happens. PGHOST, PGPORT, PGUSER, PGDATABASE and PGSSLMODE are exported for
# it too, so that libpq tools such as psql find it without arguments, and
# BACKFILL_THROWAWAY=1, so that COMMAND can say its database is throwaway.
# Exits with COMMAND's exit status.
#
# BACKFILL_DURABLE=1 starts the throwaway server with production
# durability (fsync, full_page_writes and synchronous_commit on), its
# files on disk (never /dev/shm, where fsync costs nothing);
# PGTEST_TMPDIR=DIR puts a server's files in DIR.
#
# BACKFILL_KEEP=1 keeps the throwaway server after COMMAND ends, for
# inspection (psql, cmd/backfill): the script prints its DATABASE_URL and
# waits; Ctrl-C (or SIGTERM to the script) stops and removes it.
#
# Arguments are not expanded by this script: to pass the URL as an argument,
# quote it for the inner shell, e.g.
#   internal/pgtest/with-postgres.sh sh -c 'psql "$DATABASE_URL" -c "select 1"'
set -euo pipefail

if [[ $# -eq 0 ]]; then
	echo "usage: $0 COMMAND [ARG...]" >&2
	exit 2
fi
if [[ -n "${DATABASE_URL:-}" ]]; then
	exec "$@"
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/with-postgres.XXXXXX")
pid=""

stop() {
	local rc=$?
	trap - EXIT INT TERM
	# Closing pgtmp's stdin tells it to stop the server.
	exec 3>&- 2>/dev/null || true
	if [[ -n "$pid" ]]; then
		local i
		for ((i = 0; i < 600; i++)); do # 60 s
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
	exit "$rc"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A built binary rather than `go run`, so that $pid is pgtmp itself.
(cd "$root" && go build -o "$work/pgtmp" ./internal/pgtest/pgtmp)
mkfifo "$work/stdin"
"$work/pgtmp" <"$work/stdin" >"$work/out" 2>"$work/err" &
pid=$!
exec 3>"$work/stdin" # held open until stop()

url=""
for ((i = 0; i < 1200; i++)); do # 120 s
	line=$(head -n 1 "$work/out" 2>/dev/null || true)
	if [[ "$line" == DATABASE_URL=* ]]; then
		url=${line#DATABASE_URL=}
		break
	fi
	if ! kill -0 "$pid" 2>/dev/null; then
		break
	fi
	sleep 0.1
done
if [[ -z "$url" ]]; then
	echo "with-postgres: could not start PostgreSQL:" >&2
	cat "$work/err" >&2 || true
	exit 1
fi
export DATABASE_URL="$url"
# The same server for libpq tools (psql, pg_dump) run without a URL.
hostport=${url#postgres://postgres@}
hostport=${hostport%%/*}
export PGHOST=${hostport%:*} PGPORT=${hostport##*:} PGUSER=postgres PGDATABASE=postgres PGSSLMODE=disable
export BACKFILL_THROWAWAY=1

if [[ -n "${BACKFILL_KEEP:-}" ]]; then
	# A Ctrl-C meant for COMMAND (e.g. the demo's pause) must not remove
	# the server that is to be kept.
	trap ':' INT
fi
set +e
"$@"
rc=$?
set -e
if [[ -n "${BACKFILL_KEEP:-}" ]]; then
	echo >&2
	echo "with-postgres: BACKFILL_KEEP is set: the server is kept for inspection, e.g. in another shell:" >&2
	echo "  export DATABASE_URL='$url'" >&2
	echo "  psql \"\$DATABASE_URL\"    # or: go -C cmd/backfill run . runs" >&2
	echo "with-postgres: press Ctrl-C to stop and remove it" >&2
	trap 'exit "$rc"' INT TERM
	while :; do
		sleep 1 &
		wait $! || true
	done
fi
exit "$rc"
