#!/usr/bin/env bash
# Fails when a tracked file is larger than the limit (default 1 MB) and is
# not a declared fixture in .ci/large-files.allow (one repository path a
# line; # starts a comment), and on any tracked executable (ELF, Mach-O or
# PE header) whatever its size: build outputs are never tracked; test data
# that must be larger is declared there, with a reason.
# Usage: .ci/large-files.sh [limit-bytes]
set -euo pipefail
cd "$(dirname "$0")/.."
limit="${1:-1048576}"
allow=".ci/large-files.allow"
declare -A allowed=()
if [ -f "$allow" ]; then
	while IFS= read -r line || [ -n "$line" ]; do
		line="${line%%#*}"
		line="$(echo "$line" | xargs)"
		[ -n "$line" ] && allowed["$line"]=1
	done <"$allow"
fi
bad=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue # deleted in the work tree, or a submodule
	size=$(stat -c %s "$f")
	if [ "$size" -gt "$limit" ] && [ -z "${allowed[$f]:-}" ]; then
		echo "large-files: $f is $size bytes (limit $limit; declare test fixtures in $allow)"
		bad=1
	fi
	magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface | 4d5a*)
		echo "large-files: $f is an executable (header $magic): build outputs are never tracked"
		bad=1
		;;
	esac
done < <(git ls-files -z)
if [ "$bad" -ne 0 ]; then
	exit 1
fi
echo "large-files: no tracked file over $limit bytes outside $allow"
