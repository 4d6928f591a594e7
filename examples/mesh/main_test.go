package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMeshAcrossProcesses builds the example and runs it: three node
// processes on loopback sync over the remote transport with mutual TLS,
// converge, and a fourth joining later catches up from genesis.
func TestMeshAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := filepath.Join(t.TempDir(), "mesh")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-n", "3", "-rows", "5", "-join", "300", "-dir", t.TempDir(), "-timeout", "90s").CombinedOutput()
	s := string(out)
	if err != nil {
		t.Fatalf("mesh: %v\n%s", err, s)
	}
	// Before it catches up, the joiner's lag shows in events while its
	// time lag still reads 0 (it has reported no watermark yet).
	if !regexp.MustCompile(`joiner behind by [1-9][0-9]* events \(backlog [1-9][0-9]*, re-offers 0\), 0 ms, no watermark yet`).MatchString(s) {
		t.Fatalf("output does not show the joiner's lag in events:\n%s", s)
	}
	for _, want := range []string{"mutual TLS", "converged: every node holds the same rows", "joiner caught up", "joiner   → node-0 behind by 0 events (backlog 0, re-offers 0), 0 ms"} {
		if !strings.Contains(s, want) {
			t.Fatalf("output lacks %q:\n%s", want, s)
		}
	}
}
