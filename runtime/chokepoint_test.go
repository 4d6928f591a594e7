package runtime

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// SSP/1 §12: a forged or out-of-scope event in the middle of a batch
// drops on its own and the events behind it apply.
func TestChokepointBadEventMidBatchDoesNotStopOthers(t *testing.T) {
	n := openTestNode(t, Config{Scope: []string{"app/*"}})
	n.define(defT)
	good, forger := newPeer(t, 1), newPeer(t, 9)
	n.trust(good)
	now := n.wall.MS()
	forged := forger.upsert(hlcAt(now, 1), 2, map[string]any{"a": "evil"})
	tampered := good.upsert(hlcAt(now, 2), 3, map[string]any{"a": "x"})
	tampered[len(tampered)-1] ^= 1 // break the signature
	outOfScope := good.event(&messages.Event{HLC: hlcAt(now, 3), Schema: "other", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{}})
	batch := [][]byte{
		good.upsert(hlcAt(now, 4), 1, map[string]any{"a": "first"}),
		forged, tampered, outOfScope,
		good.upsert(hlcAt(now, 5), 4, map[string]any{"a": "behind"}),
	}
	outs, err := n.ApplySignedBatch(n.ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind   messages.OutcomeKind
		reason messages.Reason
	}{
		{messages.Applied, 0},
		{messages.Dropped, messages.ReasonSignature},
		{messages.Dropped, messages.ReasonSignature},
		{messages.Dropped, messages.ReasonOutOfScope},
		{messages.Applied, 0},
	}
	for i, w := range want {
		if outs[i].Kind != w.kind || outs[i].Reason != w.reason {
			t.Errorf("event %d: got %v, want %v/%v", i, outs[i], w.kind, w.reason)
		}
	}
	if r, ok := n.get(4); !ok {
		t.Fatal("event behind the bad ones was not applied")
	} else if v, _ := cellString(t, r, "a"); v != "behind" {
		t.Fatalf("a = %q", v)
	}
	if _, ok := n.get(2); ok {
		t.Fatal("forged event materialized")
	}
	// The same checks one at a time through ApplySigned: same verdicts.
	for i, raw := range batch {
		out := n.apply(raw)
		if i == 0 || i == 4 {
			if out.Kind != messages.Duplicate {
				t.Errorf("re-apply %d: %v", i, out)
			}
		} else if out.Kind != want[i].kind || out.Reason != want[i].reason {
			t.Errorf("single %d: %v", i, out)
		}
	}
}

// §12 step 1: unknown kid, invalid signature, wrong mesh, above the
// retirement cutoff → dropped and surfaced, never held or retained.
func TestChokepointSignatureFailuresDroppedAndSurfaced(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	ns := n.collect()
	p := newPeer(t, 1)
	now := n.wall.MS()

	unknown := p.upsert(hlcAt(now, 1), 1, map[string]any{"a": "x"})
	if out := n.apply(unknown); out.Kind != messages.Dropped || out.Reason != messages.ReasonSignature {
		t.Fatalf("unknown kid: %v", out)
	}
	ns.waitFor(t, "dropped", func(x messages.Notice) bool {
		d, ok := x.(messages.EventDropped)
		return ok && d.Outcome.Reason == messages.ReasonSignature
	})
	// Not retained: after trusting the key the same bytes apply as new.
	n.trust(p)
	if out := n.apply(unknown); out.Kind != messages.Applied {
		t.Fatalf("after trust: %v", out)
	}

	// Retirement cutoff: at the cutoff passes, above it fails.
	cut := hlcAt(now, 10)
	if err := n.Retire(n.ctx, p.key().Kid, cut); err != nil {
		t.Fatal(err)
	}
	if out := n.apply(p.upsert(cut, 2, map[string]any{"a": "at"})); out.Kind != messages.Applied {
		t.Fatalf("at cutoff: %v", out)
	}
	if out := n.apply(p.upsert(cut+1, 3, map[string]any{"a": "above"})); out.Kind != messages.Dropped || out.Reason != messages.ReasonSignature {
		t.Fatalf("above cutoff: %v", out)
	}

	// Another mesh's signature does not verify here.
	other := newPeer(t, 2)
	n.trust(other)
	e := &messages.Event{Site: other.signer.Site(), HLC: hlcAt(now, 1), Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(5)}, Payload: messages.Columns{}}
	raw, err := other.signer.Sign(e, []byte("another-mesh"))
	if err != nil {
		t.Fatal(err)
	}
	if out := n.apply(raw); out.Kind != messages.Dropped || out.Reason != messages.ReasonSignature {
		t.Fatalf("other mesh: %v", out)
	}
}

// §12 step 2 and the skew row of §13.6: more than 300 000 ms ahead is
// rejected, surfaced, not retained; it applies once the clock catches up.
func TestChokepointClockSkewRejectedNotRetained(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	ns := n.collect()
	now := n.wall.MS()
	atBound := p.upsert(hlcAt(now+300_000, 0), 1, map[string]any{"a": "edge"})
	if out := n.apply(atBound); out.Kind != messages.Applied {
		t.Fatalf("exactly at the bound: %v", out)
	}
	future := p.upsert(hlcAt(now+300_001, 0), 2, map[string]any{"a": "future"})
	out := n.apply(future)
	if out.Kind != messages.Rejected || out.Reason != messages.ReasonClockSkew || out.AdvancesWatermark() {
		t.Fatalf("far future: %v", out)
	}
	ns.waitFor(t, "rejected", func(x messages.Notice) bool { _, ok := x.(messages.EventRejected); return ok })
	if _, ok := n.get(2); ok {
		t.Fatal("rejected event materialized")
	}
	if out := n.apply(future); out.Kind != messages.Rejected {
		t.Fatalf("re-offer before the clock catches up: %v (a Duplicate would mean it was retained)", out)
	}
	n.wall.Advance(time.Millisecond)
	if out := n.apply(future); out.Kind != messages.Applied {
		t.Fatalf("after the clock caught up: %v", out)
	}
}

// Checks run in order: a forged event is a signature drop even when it is
// also out of scope and skewed; a skewed out-of-scope event is rejected
// for skew (step 2 before step 3).
func TestChokepointCheckOrder(t *testing.T) {
	n := openTestNode(t, Config{Scope: []string{"app/t"}})
	p, stranger := newPeer(t, 1), newPeer(t, 2)
	n.trust(p)
	far := hlcAt(n.wall.MS()+10*60_000, 0)
	e := func(s *peer) []byte {
		return s.event(&messages.Event{HLC: far, Schema: "x", Table: "y", Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{}})
	}
	if out := n.apply(e(stranger)); out.Reason != messages.ReasonSignature {
		t.Fatalf("forged+skewed+out of scope: %v", out)
	}
	if out := n.apply(e(p)); out.Kind != messages.Rejected || out.Reason != messages.ReasonClockSkew {
		t.Fatalf("skewed+out of scope: %v", out)
	}
}

// §12 steps 4 and 5: duplicates are no-ops; the local clock observes the
// applied event's HLC.
func TestChokepointDuplicateNoopAndHLCObserve(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	ahead := hlcAt(n.wall.MS()+120_000, 5)
	raw := p.upsert(ahead, 1, map[string]any{"a": "x"})
	if out := n.apply(raw); out.Kind != messages.Applied {
		t.Fatal(out)
	}
	if out := n.apply(raw); out.Kind != messages.Duplicate || !out.AdvancesWatermark() {
		t.Fatalf("duplicate: %v", out)
	}
	out, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 2}, map[string]any{"a": "local"})
	if err != nil || out.Kind != messages.Applied {
		t.Fatalf("local write: %v %v", out, err)
	}
	if out.HLC <= ahead {
		t.Fatalf("local HLC %v not above observed %v", out.HLC, ahead)
	}
}

// An event attributed to a site other than its signer's is a forgery.
func TestChokepointSiteMustBeSigners(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	p, victim := newPeer(t, 1), newPeer(t, 2)
	n.trust(p)
	n.trust(victim)
	vs := victim.signer.Site()
	e := map[string]any{"v": 1, "site": vs[:], "hlc": uint64(hlcAt(n.wall.MS(), 0)), "schema": "app", "table": "t",
		"key": map[string]any{"id": 1}, "payload": map[string]any{"a": "spoof"}}
	if out := n.apply(p.rawEvent(e)); out.Kind != messages.Dropped || out.Reason != messages.ReasonSignature {
		t.Fatalf("spoofed site: %v", out)
	}
}
