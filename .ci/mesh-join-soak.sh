#!/usr/bin/env bash
# examples/mesh -join soak: a node joining a 3-node mesh over
# mutual TLS catches up on JOIN events from genesis, RUNS times; every run
# must converge. Usage: .ci/mesh-join-soak.sh [RUNS] [JOIN]
set -u
runs=${1:-20}
join=${2:-20000}
go=${GO:-go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$go build -o "$work/mesh" ./examples/mesh || exit 1
ok=0
for i in $(seq 1 "$runs"); do
	start=$(date +%s)
	if "$work/mesh" -n 3 -join "$join" -dir "$work/run$i" -timeout 10m >"$work/out$i" 2>&1; then
		ok=$((ok + 1))
		echo "run $i/$runs: converged in $(( $(date +%s) - start )) s: $(grep -o 'joiner caught up in [^;]*' "$work/out$i")"
	else
		echo "run $i/$runs: FAILED after $(( $(date +%s) - start )) s; output:"
		tail -n 30 "$work/out$i"
	fi
	rm -rf "$work/run$i"
done
echo "mesh -join $join: converged in $ok of $runs runs (load: $(uptime | sed 's/.*load average: //'))"
[ "$ok" = "$runs" ]
