package session_test

import (
	"flag"
	"testing"

	"github.com/syncmesh/syncmesh/actors/session"
)

var idleSessions = flag.Int("idle-sessions", 10_000, "sessions measured by BenchmarkIdleSessionMemory")

// BenchmarkRoundTrip measures one encrypt (alice's actor) plus one decrypt
// (bob's actor), each persisted to a memory store, on an established
// session.
func BenchmarkRoundTrip(b *testing.B) {
	ms := newMesh(b)
	a := ms.add(aliceAddr, nil, nil)
	bb := ms.add(bobAddr, nil, nil)
	mustDecrypt(b, bb, a.addr, mustEncrypt(b, a, bb.addr, "hello"), "hello")
	mustDecrypt(b, a, bb.addr, mustEncrypt(b, bb, a.addr, "hi"), "hi")
	pt := make([]byte, 256)
	b.SetBytes(int64(len(pt)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		env, err := a.m.Encrypt(bg, bb.addr, pt)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bb.m.Decrypt(bg, a.addr, env); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoundTripPingPong alternates directions, so every message takes
// a DH ratchet step.
func BenchmarkRoundTripPingPong(b *testing.B) {
	ms := newMesh(b)
	a := ms.add(aliceAddr, nil, nil)
	bb := ms.add(bobAddr, nil, nil)
	mustDecrypt(b, bb, a.addr, mustEncrypt(b, a, bb.addr, "hello"), "hello")
	pt := make([]byte, 256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		from, to := a, bb
		if i%2 == 1 {
			from, to = bb, a
		}
		i++
		env, err := from.m.Encrypt(bg, to.addr, pt)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := to.m.Decrypt(bg, from.addr, env); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkIdleSessionMemory reports the resident heap per idle session,
// persisted (record in the store, no actor) and live (a spawned, idle
// session actor holding its decoded record, on top of the stored record).
// Set the count with -idle-sessions (the lead's report uses 100000).
func BenchmarkIdleSessionMemory(b *testing.B) {
	n := *idleSessions
	// One measurement per run whatever -benchtime says (b.Loop runs the
	// function body once); the loop itself times nothing.
	persisted, live, err := session.MeasureIdleSessions(n)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(persisted)/float64(n), "B/persisted-session")
	b.ReportMetric(float64(live)/float64(n), "B/live-session")
	b.ReportMetric(float64(n), "sessions")
}

func TestMeasureIdleSessions(t *testing.T) {
	persisted, live, err := session.MeasureIdleSessions(200)
	if err != nil {
		t.Fatal(err)
	}
	// A stored record is at least a few hundred bytes of keys; a live actor
	// holds at least its decoded record.
	if persisted < 200*200 || live < 200*200 {
		t.Fatalf("implausible measurement: persisted %d B, live %d B for 200 sessions", persisted, live)
	}
	if _, _, err := session.MeasureIdleSessions(0); err == nil {
		t.Fatal("n = 0 accepted")
	}
}
