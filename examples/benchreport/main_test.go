package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/runtime/hosting/replication"
)

// TestMain lets the report's child processes (one-core arms, joiners,
// fresh-store applies) run inside the test binary.
func TestMain(m *testing.M) {
	ab.Main()
	os.Exit(m.Run())
}

// TestSyncAndCatchupReportsRun runs both sync sections small, end to end:
// they fail on any event not applied, a forgery not dropped (or a valid
// event dropped), a joiner that does not reach every event, or a child
// that fails.
func TestSyncAndCatchupReportsRun(t *testing.T) {
	if err := syncReport(syncParams{Events: 300, Writers: 2, Batch: 100, Sites: 4, Trials: 1, Preload: 1000, Pushes: 1}); err != nil {
		t.Fatal(err)
	}
	// One size: each size's source starts a protoactor remote in this
	// process, and a second remote.Start trips -race inside protoactor
	// (grpclog.SetLoggerV2); the growth rows run in make bench.
	if err := catchupReport(catchupParams{Sizes: []int{600}, Sites: 4, Writers: 2, Batch: 200, PushBatch: 200, Trials: 1}); err != nil {
		t.Fatal(err)
	}
}

// The workload is the benchmark's fixed shape: 4 sites round-robin, rows
// i % 5000, every epoch fresh events of the same rows; event files round
// trip.
func TestWorkloadAndEventFiles(t *testing.T) {
	peers := benchPeers(4)
	a, err := makeEventsRange(peers, 0, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := makeEventsRange(peers, 5, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		if !slices.Equal(a[5+i][:len(a[5+i])-64], b[i][:len(b[i])-64]) {
			t.Fatalf("event %d of a range differs from the same event of the whole epoch", 5+i)
		}
	}
	c, err := makeEventsRange(peers, 0, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(a[0], c[0]) {
		t.Fatal("two epochs share an event")
	}
	if again := benchPeers(4); !slices.Equal(again[2].signer.PublicKey(), peers[2].signer.PublicKey()) {
		t.Fatal("site keys are not deterministic: a child would trust other keys")
	}
	path := filepath.Join(t.TempDir(), "e.ev")
	if err := writeEvents(path, a); err != nil {
		t.Fatal(err)
	}
	back, err := readEvents(path)
	if err != nil || len(back) != len(a) {
		t.Fatalf("read back %d events, %v", len(back), err)
	}
	for i := range a {
		if !slices.Equal(a[i], back[i]) {
			t.Fatalf("event %d changed in the file", i)
		}
	}
}

// TestReconcileReportRuns runs the reconciliation section small, end to
// end, hostile rows included: it fails when a d found differs from the
// one added, a hostile request is refused before its budget or served
// past it, or a hostile responder's session does not end as the peer's
// error.
func TestReconcileReportRuns(t *testing.T) {
	if err := reconcileReport(reconcileParams{Events: 2000, Sites: 4, Batch: 500, Trials: 1}); err != nil {
		t.Fatal(err)
	}
}

// The tables section runs end to end, small: it fails on a write that
// did not land (tablesTrial reads every row back).
func TestTablesReportRuns(t *testing.T) {
	if err := tablesReport(30, 10, 1); err != nil {
		t.Fatal(err)
	}
}

// The replication section runs end to end, small: it fails on a commit
// that errs or a replica that never learns of a unit.
func TestReplicationReportRuns(t *testing.T) {
	c, tr, u := *replCommits, *replTrials, *replUnits
	defer func() { *replCommits, *replTrials, *replUnits = c, tr, u }()
	*replCommits, *replTrials, *replUnits = 128, 1, 64
	replTune = func(c *replication.Config) {
		c.HeartbeatTimeout, c.ElectionTimeout, c.BootstrapWait = 400*time.Millisecond, 400*time.Millisecond, 800*time.Millisecond
	}
	defer func() { replTune = nil }()
	if err := replicationReport(); err != nil {
		t.Fatal(err)
	}
}
