# syncmesh — the README's two commands are `make run` and `make test`.
GO        ?= go
FUZZTIME  ?= 10s
BENCHTIME ?= 1x
TESTFLAGS ?=

.PHONY: run test conformance bench bench-1m fuzz lint soak soak-join proto etcd

## run: the quickstart on the embedded bbolt default (no setup).
run:
	$(GO) run ./examples/quickstart

## test: vet, then every test under the race detector (CI calls this),
## then the sync plane's packages again with the invariant checks compiled
## in (-tags invariants: actors/internal/invariants), and the runtime's
## sync-plane tests (DDL, held groups, convergence, restarts) with them,
## and the short node-level restore-and-clone soak (-tags syncmesh_aeadtrace:
## every AES-GCM key and nonce the ratchet seals under is recorded).
## runtime/hosting's TestClusterCrashEtcd needs an etcd binary: see etcd.
INVARIANT_PKGS ?= ./actors/clock ./actors/syncgroup ./actors/apply ./actors/replicate
INVARIANT_RUNTIME ?= AddColumn|Convergence|Held|Define|Horizon|Trust|Rehydrate|Purge|Equivoc|Chokepoint|Restart
test: etcd
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) ./...
	$(GO) test -race -count=1 -timeout 10m -tags invariants $(TESTFLAGS) $(INVARIANT_PKGS)
	$(GO) test -race -count=1 -timeout 10m -tags invariants -run '$(INVARIANT_RUNTIME)' $(TESTFLAGS) ./runtime
	$(GO) test -race -count=1 -timeout 10m -tags syncmesh_aeadtrace -run 'TestNodeRestoreAndCloneSoak' $(TESTFLAGS) ./runtime

## conformance: the public test-vector sets (Wycheproof, C2SP CCTV,
## ed25519-speccheck, RFC 8032, BLAKE3, cose-wg, RFC 8949 Appendix A) stored
## under */testdata/conformance, through the project's own code paths; one
## line per set: vectors run, expected verdicts met, stated departures.
## make test runs the same tests.
conformance:
	GO=$(GO) bash .ci/conformance.sh

## etcd: install Debian's etcd-server when no etcd is on PATH (as root:
## apt-get update, then apt-get install). The test starts etcd itself on
## free loopback ports; without etcd it skips, except under CI=true, where
## it fails.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then \
			echo "installing etcd-server (apt-get)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
		else \
			echo "etcd missing and not root: TestClusterCrashEtcd skips (fails under CI=true)"; \
		fi; }

## bench: the benchmark report (ratios against ceilings measured in the same run,
## A and B interleaved, min/median/max). The sync section applies to a store
## whose history (100 000 events) is on the SAME rows as the measured events.
## bench-1m: the sync plane's targets at 1 000 000 events (store history and
## catch-up from genesis; takes many minutes).
BENCHFLAGS ?=
bench:
	$(GO) run ./examples/benchreport $(BENCHFLAGS)

bench-1m:
	$(GO) run ./examples/benchreport -only sync -preload 1000000 $(BENCHFLAGS)
	$(GO) run ./examples/benchreport -only catchup -catchup-events 100000,1000000 -catchup-trials 1 $(BENCHFLAGS)
	$(GO) run ./examples/benchreport -only reconcile -reconcile-events 1000000 $(BENCHFLAGS)
	$(GO) run ./examples/benchreport -only queries -queries-rows 1000000 -queries-trials 3 $(BENCHFLAGS)

## fuzz: a short run of every fuzz target.
fuzz:
	bash .ci/fuzz.sh $(FUZZTIME)

## lint: formatting, vet, staticcheck (pinned; CI runs it too) and the
## tracked-file size check.
STATICCHECK_VERSION ?= v0.8.2
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	bash .ci/large-files.sh

## soak: long randomized runs: the property tests with many more cases
## (SOAK_CHECKS, default 20000), the 5-node mesh simulation over many
## seeds (SIM_SEEDS, default 300; reproduce one with SIM_SEED=<seed>),
## anything behind the soak build tag (the hosting fault harness, 12
## rounds of faults, with its take-over percentiles; hosting's pages at
## the full MaxPageBytes, with more than a frame of data; five members
## with Replicas 3 and two removals), the node-level
## restore-and-clone soak (SOAK_RESTORE_ROUNDS rounds, default 400;
## reproduce one with SOAK_RESTORE_SEED=<seed>), the examples/mesh
## -join 20000 soak (JOIN_RUNS runs, default 20), and the multi-process
## soaks of examples/soak: the hostile run (HOSTILE_SOAK per run, control
## and attack) and the load-and-faults run (FAULTS_SOAK, 5-minute windows),
## and the replicated units' leader-kill rounds (REPLICATION_SOAK_ROUNDS,
## default 40: acknowledged writes kept, take-over p50/p99/max).
REPLICATION_SOAK_ROUNDS ?= 40
SOAK_CHECKS ?= 20000
SIM_SEEDS ?= 300
JOIN_RUNS ?= 20
SOAK_RESTORE_ROUNDS ?= 400
HOSTILE_SOAK ?= 4m
FAULTS_SOAK ?= 32m
soak:
	$(GO) test -count=1 -timeout 90m -tags soak -run 'Property|Convergence|Canonical|Match' \
		./actors/materialize ./runtime ./messages ./persistence/bolt -rapid.checks=$(SOAK_CHECKS)
	SIM_SEEDS=$(SIM_SEEDS) $(GO) test -count=1 -timeout 90m -run 'TestSimulatedMeshConverges' ./runtime
	$(GO) test -count=1 -timeout 60m -tags soak -run 'TestClusterFaults|TestPagesEndBeforeTheFrame|TestClusterReplicatedMembers' -v ./runtime/hosting
	REPLICATION_SOAK_ROUNDS=$(REPLICATION_SOAK_ROUNDS) $(GO) test -count=1 -timeout 30m -run 'TestLeaderKillRounds' -v ./runtime/hosting/replication
	SOAK_RESTORE_ROUNDS=$(SOAK_RESTORE_ROUNDS) $(GO) test -count=1 -timeout 90m -tags syncmesh_aeadtrace -run 'TestNodeRestoreAndCloneSoak' -v ./runtime
	GO=$(GO) bash .ci/mesh-join-soak.sh $(JOIN_RUNS) 20000
	$(GO) run ./examples/soak -scenario hostile -duration $(HOSTILE_SOAK) -phase 30s
	$(GO) run ./examples/soak -scenario faults -duration $(FAULTS_SOAK) -window 5m

## soak-join: only the examples/mesh -join 20000 soak (JOIN_RUNS runs, default
## 20; every one must converge).
soak-join:
	GO=$(GO) bash .ci/mesh-join-soak.sh $(JOIN_RUNS) 20000

## proto: regenerate messages/wire/wire.pb.go (needs protoc: Debian's
## protobuf-compiler; installs protoc-gen-go at go.mod's protobuf version).
## The generated file is committed: builds and CI need no protoc.
PROTOC_GEN_GO_VERSION ?= $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
proto:
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	@PATH="$$($(GO) env GOPATH)/bin:$$PATH"; command -v protoc-gen-go >/dev/null || \
		$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc --proto_path=messages/wire \
		--go_out=messages/wire --go_opt=paths=source_relative messages/wire/wire.proto
