package hosting_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// demoReport mirrors the JSON printed by internal/clusterdemo.
type demoReport struct {
	Devices, Groups int
	UnitsPerMember  map[string]int
	Victim          string
	VictimDevices   []string
	VictimGroups    []string
	EventsAcked     int
	Committed       int
	Pending         int
	MovedTo         map[string]string
	LoadEvents      int
	LoadMessages    int
	Passivated      bool
	OK              bool
	Error           string
}

// TestClusterMemberLoss starts a 3-member protoactor-go cluster (test
// provider, one shared InMemAgent, disthash placement), hosts ≥6 devices
// and ≥3 sync groups across the members (each grain reports the member
// it runs on; every member hosts some), applies signed events and
// exchanges and commits messages, stops the member hosting the most units,
// and checks on the survivors that every acknowledged event and every
// commit is still there, pending messages are still pending at both
// ends, nothing committed is pending again, and the lost member's units
// answer from survivors, reopened from their persisted state (the
// scenario itself is internal/scenario). Requests for the stopped member's
// units run throughout the stop (each retried until acknowledged) and
// must all be there afterwards. With -idle 1s the child also checks that
// idle grains passivate (their nodes closed) after the scenario.
//
// The cluster runs in a child process built WITHOUT -race: several
// protoactor remotes in one process trip the race detector inside
// protoactor's remote (remote.Start replaces grpclog's global logger while
// another remote runs; docs/architecture.md, "protoactor-go at the pinned version").
// Everything of ours that the child runs — the host, the grain handlers,
// the Placement-routed device transport, the client — also runs under
// -race in this package's Local tests. Wall time: ~10 s (StartMember
// sleeps 1 s per member, a graceful Shutdown 2 s) plus the build.
func TestClusterMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member cluster in a child process")
	}
	exe := filepath.Join(t.TempDir(), "clusterdemo")
	goBin := goTool()
	build := exec.Command(goBin, "build", "-o", exe, "github.com/syncmesh/syncmesh/runtime/hosting/internal/clusterdemo")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build clusterdemo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := t.TempDir()
	cmd := exec.CommandContext(ctx, exe, "-root", root, "-members", "3", "-timeout", "2m", "-idle", "1s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("clusterdemo ran %v; progress:\n%s", time.Since(start), stderr.String())
	if err != nil {
		t.Fatalf("clusterdemo: %v\nstdout:\n%s", err, stdout.String())
	}
	var rep demoReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, stdout.String())
	}
	if !rep.OK || rep.Error != "" {
		t.Fatalf("scenario failed: %s", rep.Error)
	}
	if rep.Devices < 6 || rep.Groups < 3 {
		t.Fatalf("hosted %d devices and %d groups, want ≥6 and ≥3", rep.Devices, rep.Groups)
	}
	if len(rep.UnitsPerMember) != 3 {
		t.Fatalf("units on %d members, want 3: %v", len(rep.UnitsPerMember), rep.UnitsPerMember)
	}
	for m, n := range rep.UnitsPerMember {
		if n == 0 {
			t.Fatalf("member %s hosts nothing: %v", m, rep.UnitsPerMember)
		}
	}
	if len(rep.VictimDevices) == 0 || len(rep.VictimGroups) == 0 {
		t.Fatalf("the stopped member hosted devices %v and groups %v; want both", rep.VictimDevices, rep.VictimGroups)
	}
	if len(rep.MovedTo) != len(rep.VictimDevices)+len(rep.VictimGroups) {
		t.Fatalf("moved %v, want every unit of %s", rep.MovedTo, rep.Victim)
	}
	for u, m := range rep.MovedTo {
		if m == rep.Victim || rep.UnitsPerMember[m] == 0 {
			t.Fatalf("%s moved to %s, not a survivor", u, m)
		}
	}
	if rep.LoadEvents == 0 || rep.LoadMessages == 0 {
		t.Fatalf("no request was in flight on the stopped member's units: %+v", rep)
	}
	if !rep.Passivated {
		t.Fatal("idle grains were not passivated")
	}
	if rep.EventsAcked == 0 || rep.Committed == 0 || rep.Pending == 0 {
		t.Fatalf("nothing exercised: %+v", rep)
	}
	t.Logf("report: %+v", rep)
}

// frameReport mirrors the JSON internal/clusterdemo prints with -frames.
type frameReport struct {
	Via, Host                      string
	RequestBytes, Rows, ReplyBytes int
	OversizeRefused, OversizeTook  string
	OK                             bool
	Error                          string
}

// TestClusterCarriesFullFrames: between two members, an apply request of
// ~6 MiB and the scan reply carrying it back cross in one message each
// (gRPC's default bound, 4 MiB, is below one MaxFrame), and an apply past
// MaxFrame is refused at once with ErrBadRequest and
// messages.ErrTooLarge instead of being dropped by the sending member
// and timing out. The cluster runs in a child process, as in
// TestClusterMemberLoss.
func TestClusterCarriesFullFrames(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 2-member cluster in a child process")
	}
	exe := filepath.Join(t.TempDir(), "clusterdemo")
	if out, err := exec.Command(goTool(), "build", "-o", exe, "github.com/syncmesh/syncmesh/runtime/hosting/internal/clusterdemo").CombinedOutput(); err != nil {
		t.Fatalf("build clusterdemo: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-root", t.TempDir(), "-members", "2", "-timeout", "2m", "-frames")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("clusterdemo -frames:\n%s", stderr.String())
	var rep frameReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("report: %v (run: %v)\n%s", jerr, err, stdout.String())
	}
	if err != nil || !rep.OK {
		t.Fatalf("frames: %s (run: %v)", rep.Error, err)
	}
	if rep.Via == rep.Host || rep.RequestBytes <= 4<<20 || rep.ReplyBytes <= 4<<20 || rep.OversizeRefused == "" {
		t.Fatalf("nothing crossed between members past 4 MiB: %+v", rep)
	}
	t.Logf("report: %+v", rep)
}
