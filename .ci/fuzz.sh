#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time each.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-10s}"
status=0
while IFS= read -r line; do
  file="${line%%:*}"; name="${line##*func }"; name="${name%%(*}"
  pkg="./$(dirname "$file")"
  echo "== $pkg $name ($fuzztime)"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" || status=1
done < <(git grep -n -E '^func Fuzz[A-Za-z0-9_]*\(' -- '*_test.go' | sed -E 's/^([^:]+):[0-9]+:(.*)$/\1:\2/')
exit $status
