# syncmesh — the README's two commands are `make run` and `make test`.
GO        ?= go
FUZZTIME  ?= 10s
BENCHTIME ?= 1x
TESTFLAGS ?=

.PHONY: run test bench fuzz lint soak proto

## run: the quickstart on the embedded bbolt default (no setup).
run:
	$(GO) run ./examples/quickstart

## test: vet, then every test under the race detector (CI calls this).
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) ./...

## bench: the benchmark report (ratios against ceilings measured in the same run).
bench:
	$(GO) run ./examples/benchreport

## fuzz: a short run of every fuzz target.
fuzz:
	bash .ci/fuzz.sh $(FUZZTIME)

## lint: formatting and vet.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## soak: long randomized runs: the property tests with many more cases
## (SOAK_CHECKS, default 20000) and anything behind the soak build tag.
SOAK_CHECKS ?= 20000
soak:
	$(GO) test -count=1 -timeout 90m -tags soak -run 'Property|Convergence|Canonical|Match' \
		./actors/materialize ./runtime ./messages ./persistence/bolt -rapid.checks=$(SOAK_CHECKS)
