#!/usr/bin/env bash
# Fetches the earthquakes example's data from the npm package vega-datasets
# (BSD-3-Clause; the data is USGS, U.S. public domain) into
# examples/earthquakes/data/, once:
#   data/earthquakes.json  1,707 USGS events, 2018-01-31 to 2018-02-07 (GeoJSON)
#
# Needs npm (only `npm pack`, which downloads the package tarball into a
# temporary directory; nothing is installed) and tar.
#
# The file is verified against the hash that the package's own
# datapackage.json publishes. Note: that "sha1:" value is a git blob hash,
# sha1("blob <size>\0" + content), as `git hash-object` prints it, not the
# plain sha1sum of the file.
set -euo pipefail

VERSION=3.2.1
QUAKES_BLOB_SHA1=ed4c47436c09d5cc5f428c233fbd8074c0346fd0 # datapackage.json, earthquakes

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

if [ -f "$dir/earthquakes.json" ]; then
	verify "$dir/earthquakes.json" "$QUAKES_BLOB_SHA1"
	echo "fetch-data: $dir already holds vega-datasets@$VERSION earthquakes.json"
	exit 0
fi

command -v npm >/dev/null || { echo "fetch-data: npm not found (apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "fetch-data: npm pack vega-datasets@$VERSION" >&2
tgz=$(cd "$tmp" && npm pack --silent "vega-datasets@$VERSION" | tail -n 1)
tar -xzf "$tmp/$tgz" -C "$tmp" package/data/earthquakes.json

verify "$tmp/package/data/earthquakes.json" "$QUAKES_BLOB_SHA1"

mkdir -p "$dir"
# Move into place last, so an interrupted run leaves no partial file.
mv "$tmp/package/data/earthquakes.json" "$dir/earthquakes.json"
echo "fetch-data: wrote $dir/earthquakes.json (verified)"
