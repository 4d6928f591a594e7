#!/usr/bin/env bash
# make conformance: the public vector sets in */testdata/conformance through
# the project's own code paths (the TestConformance* tests, which make test
# also runs). Prints one line per set: vectors run, expected verdicts met,
# and how many of those verdicts are stated departures from upstream's.
set -uo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
PKGS="./crypto/sign ./crypto/ratchet ./crypto/sealed ./crypto/eventid ./messages"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
$GO test -count=1 -v -run '^TestConformance' $PKGS >"$log" 2>&1
rc=$?
grep -o 'conformance: .*' "$log" | sed 's/^conformance: //'
total=$(grep -o 'conformance: .*' "$log" | awk '{for (i=1;i<=NF;i++) if ($i=="vectors") s+=$(i-1)} END {print s+0}')
echo "total: $total vectors"
if [ "$rc" -ne 0 ]; then
	echo "conformance FAILED:"
	grep -E -- '--- FAIL|^\s+\S+_test.go:[0-9]+: ' "$log" | grep -v 'conformance: ' | head -50
	grep -E '^(FAIL|ok)\s' "$log"
	exit "$rc"
fi
