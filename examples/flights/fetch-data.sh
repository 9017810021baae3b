#!/usr/bin/env bash
# Fetches the flights example's data from the npm package vega-datasets
# (BSD-3-Clause) into examples/flights/data/, once:
#   data/flights-3m.parquet  3,000,000 flights, Jan-Jun 2001 (BTS on-time data)
#   data/airports.csv        3,376 US airports
#
# Needs npm (only `npm pack`, which downloads the package tarball into a
# temporary directory; nothing is installed) and tar.
#
# The parquet file is verified against the hash that the package's own
# datapackage.json publishes. Note: that "sha1:" value is a git blob hash,
# sha1("blob <size>\0" + content), as `git hash-object` prints it, not the
# plain sha1sum of the file.
set -euo pipefail

VERSION=3.2.1
FLIGHTS_BLOB_SHA1=9c4e0b480a1a60954a7e5c6bcc43e1c91a73caaa  # datapackage.json, flights-3m
AIRPORTS_BLOB_SHA1=608ba6d51fa70584c3fa1d31eb94533302553838 # datapackage.json, airports

dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/data"

# git_blob_sha1 FILE prints the git blob hash of FILE without needing git.
git_blob_sha1() {
	local size
	size=$(wc -c <"$1" | tr -d ' ')
	{ printf 'blob %s\0' "$size"; cat "$1"; } | sha1sum | cut -d' ' -f1
}

verify() { # FILE WANT
	local got
	got=$(git_blob_sha1 "$1")
	if [ "$got" != "$2" ]; then
		echo "fetch-data: $1: git blob sha1 $got, want $2 (delete it to fetch again)" >&2
		return 1
	fi
}

if [ -f "$dir/flights-3m.parquet" ] && [ -f "$dir/airports.csv" ]; then
	verify "$dir/flights-3m.parquet" "$FLIGHTS_BLOB_SHA1"
	verify "$dir/airports.csv" "$AIRPORTS_BLOB_SHA1"
	echo "fetch-data: $dir already holds vega-datasets@$VERSION data"
	exit 0
fi

command -v npm >/dev/null || { echo "fetch-data: npm not found (apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "fetch-data: npm pack vega-datasets@$VERSION" >&2
tgz=$(cd "$tmp" && npm pack --silent "vega-datasets@$VERSION" | tail -n 1)
tar -xzf "$tmp/$tgz" -C "$tmp" package/data/flights-3m.parquet package/data/airports.csv

verify "$tmp/package/data/flights-3m.parquet" "$FLIGHTS_BLOB_SHA1"
verify "$tmp/package/data/airports.csv" "$AIRPORTS_BLOB_SHA1"

mkdir -p "$dir"
# Move into place last, so an interrupted run leaves no partial file.
mv "$tmp/package/data/airports.csv" "$dir/airports.csv"
mv "$tmp/package/data/flights-3m.parquet" "$dir/flights-3m.parquet"
echo "fetch-data: wrote $dir/flights-3m.parquet and airports.csv (verified)"
