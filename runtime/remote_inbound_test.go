package runtime

import (
	"testing"
	"time"
)

// TestRemoteInboundIsBoundedPerPeerAndPushesBack: r's receiver stalls
// every push from "stall" (until released). Flooder f sends flood such
// pushes as fast as it can; r holds at most 2 × MaxConcurrentPushes of
// them (received, not answered) — counted by r's remote, whatever the
// timing — and its stream guard stops reading f's stream (push-back
// through gRPC flow control) instead of queueing the rest. Meanwhile
// honest peer h's pushes are answered: f's stall holds only f's share.
// Once released, every one of f's pushes is applied and answered.
func TestRemoteInboundIsBoundedPerPeerAndPushesBack(t *testing.T) {
	const handlers, flood = 2, 16
	const bound = 2 * handlers
	spec := remoteChildSpec{Plaintext: true, RequestTimeout: 5 * time.Minute, MaxConcurrentPushes: handlers}
	r := startRemoteChild(t, "r", spec)
	f := startRemoteChild(t, "f", spec)
	h := startRemoteChild(t, "h", spec)
	for _, p := range []struct{ name, addr string }{{"stall", f.addr}, {"honest", h.addr}} {
		if rep := r.call(remoteCmd{Op: "addpeer", Name: p.name, Peer: p.addr}); !rep.OK {
			t.Fatal(rep.Err)
		}
	}
	for i := 0; i < flood; i++ {
		if rep := f.call(remoteCmd{Op: "pushasync", Peer: r.addr, Name: "r", Type: "stall", Events: 1, EventBytes: 8}); !rep.OK {
			t.Fatal(rep.Err)
		}
	}
	// Wait (counted, not timed) until r's guard has stopped reading f's
	// stream with f's share full.
	deadline := time.Now().Add(2 * time.Minute)
	var st RemoteStats
	for {
		st = r.call(remoteCmd{Op: "stats"}).Stats
		if st.InboundWaits > 0 && st.InboundHeld == bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("r's guard never pushed back on the flood: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st.InboundPeak > bound || st.PushesReceived > bound {
		t.Fatalf("r holds more of f's pushes than its bound %d: %+v", bound, st)
	}
	// h is not stalled by f: its pushes are answered while f's wait.
	for i := 0; i < 3; i++ {
		rep := h.call(remoteCmd{Op: "push", Peer: r.addr, Name: "r", Type: "honest", Events: 3, EventBytes: 20})
		if !rep.OK || rep.Result.Applied != 2 {
			t.Fatalf("honest push %d during the flood: %+v", i, rep)
		}
	}
	st = r.call(remoteCmd{Op: "stats"}).Stats
	if st.InboundPeak > bound || st.PushesReceived != bound+3 || st.InboundHeld != bound {
		t.Fatalf("after h's pushes, r: %+v (want f's %d held, h's 3 answered)", st, bound)
	}
	if p := r.pushes(); len(p) != 3 {
		t.Fatalf("r's receiver finished %d pushes during the flood, want h's 3: %v", len(p), p)
	}

	// Released, everything f sent is applied and answered.
	if rep := r.call(remoteCmd{Op: "release"}); !rep.OK {
		t.Fatal(rep.Err)
	}
	for i := 0; i < flood; i++ {
		if rep := f.call(remoteCmd{Op: "await"}); !rep.OK || rep.Result.Applied != 1 {
			t.Fatalf("flood push %d after release: %+v", i, rep)
		}
	}
	if p := waitForLen(t, r.pushes, 3+flood); len(p) != 3+flood {
		t.Fatalf("r's receiver handled %d pushes, want %d", len(p), 3+flood)
	}
	st = r.call(remoteCmd{Op: "stats"}).Stats
	if st.InboundPeak > bound || st.PushesReceived != flood+3 || st.InboundHeld != 0 {
		t.Fatalf("after the release, r: %+v", st)
	}
}
