package replicate

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// TestLagCountsOnlyGroupsBothReport: a peer that reported a watermark for
// one of this node's three groups, at this node's own, has no lag; the
// groups it has not reported are unknown, not behind since 1970 (which
// read as ~1.8e9 s, 57 years, for a converged peer after a restart).
func TestLagCountsOnlyGroupsBothReport(t *testing.T) {
	now, err := messages.NewHLC(uint64(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()), 0)
	if err != nil {
		t.Fatal(err)
	}
	d := testDeps()
	d.Store = newStore(t) // tables app.t, app.u, app.hidden: three own groups
	d.Own = NewOwnWrites(now)
	a := &senderActor{s: &Service{deps: d}, peerW: map[persistence.GroupKey]messages.HLC{
		{Site: self, Schema: "app", Table: "t"}: now,
	}}
	lag, known := a.lagSeconds()
	if !known || lag != 0 {
		t.Fatalf("lag %v s (known %v), want 0 s: unreported groups counted from time zero", lag, known)
	}

	// Nothing reported in common: unknown, not a number.
	if lag, known := watermarkLag([]GroupWatermark{{Group: persistence.GroupKey{Site: self, Schema: "app", Table: "u"}, HLC: now}}, nil); known {
		t.Fatalf("no common group: lag %v s stated", lag)
	}
	// A group both report, 5 s behind, is the lag; an unreported one is
	// not.
	behind, _ := messages.NewHLC(now.Physical()-5000, 0)
	g := func(tb string) persistence.GroupKey {
		return persistence.GroupKey{Site: self, Schema: "app", Table: tb}
	}
	lag, known = watermarkLag([]GroupWatermark{{Group: g("t"), HLC: now}, {Group: g("u"), HLC: now}},
		map[persistence.GroupKey]messages.HLC{g("t"): behind})
	if !known || lag != 5 {
		t.Fatalf("lag %v s (known %v), want 5 s", lag, known)
	}
}
