package sessionmem

import (
	"flag"
	"testing"
)

var idleSessions = flag.Int("idle-sessions", 10_000, "sessions measured by BenchmarkIdleSessionMemory")

// BenchmarkIdleSessionMemory reports the resident heap per idle session,
// persisted (record in the store, no actor) and live (a spawned, idle
// session actor holding its decoded record, on top of the stored record).
// Set the count with -idle-sessions (the lead's report uses 100000).
func BenchmarkIdleSessionMemory(b *testing.B) {
	n := *idleSessions
	// One measurement per run whatever -benchtime says (b.Loop runs the
	// function body once); the loop itself times nothing.
	persisted, live, err := IdleSessions(n)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(persisted)/float64(n), "B/persisted-session")
	b.ReportMetric(float64(live)/float64(n), "B/live-session")
	b.ReportMetric(float64(n), "sessions")
}

func TestIdleSessions(t *testing.T) {
	persisted, live, err := IdleSessions(200)
	if err != nil {
		t.Fatal(err)
	}
	// A stored record is at least a few hundred bytes of keys; a live actor
	// holds at least its decoded record.
	if persisted < 200*200 || live < 200*200 {
		t.Fatalf("implausible measurement: persisted %d B, live %d B for 200 sessions", persisted, live)
	}
	if _, _, err := IdleSessions(0); err == nil {
		t.Fatal("n = 0 accepted")
	}
}
