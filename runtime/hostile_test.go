package runtime

// Regression tests, one per attack on the SSP/1 §14 delivery layer by a
// peer the node does not trust. Each asserts what the victim sees through
// the public API: its rows arrive everywhere, no link stalls, and nothing
// is stored for a sender the node did not configure.

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/messages"
)

// maxHLC is the largest HLC a claim can name.
const maxHLC = messages.HLC(math.MaxUint64)

// hostilePush is a push of no events carrying claims, as a hostile peer
// builds it by hand.
func hostilePush(from string, log []byte, claims ...messages.WatermarkClaim) *messages.SyncPush {
	return &messages.SyncPush{V: messages.SyncVersion, From: from, Log: log, Claims: claims}
}

func freshLog(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }

// requireRow fails unless node holds row id of app.t.
func requireRow(t *testing.T, n *testNode, who string, id int) {
	t.Helper()
	if _, ok := n.get(id); !ok {
		t.Fatalf("%s is missing row %d", who, id)
	}
}

// TestAttackUnsignedClaimCannotHideASite: a 125-byte push with no events
// and no key, from a name nobody configured (and, second, from a
// configured peer lying about another site), claims the victim's group at
// the maximum HLC. The victim's later rows must still reach the receiver
// and, through it, a third node; the receiver keeps nothing for the
// unknown name.
func TestAttackUnsignedClaimCannotHideASite(t *testing.T) {
	for _, liar := range []string{"stranger", "m"} {
		t.Run(liar, func(t *testing.T) {
			m := newTestMesh(t, 31, []string{"v", "r", "w", "m"}, nil)
			m.link("v", "r")
			m.link("r", "w")
			m.link("m", "r")
			ctx := context.Background()
			v, r, w := m.nodes["v"], m.nodes["r"], m.nodes["w"]
			upsertN(t, v.Node, 0, 1, "a")
			m.syncAll(10)
			g := messages.Group{Site: v.Identity().Site, Schema: "app", Table: "t"}
			_, _ = m.net.Transport(liar).Push(ctx, "r", hostilePush(liar, freshLog(7), messages.WatermarkClaim{Group: g, HLC: maxHLC}))
			for i := 1; i < 4; i++ {
				upsertN(t, v.Node, i, 1, "a")
				m.syncAll(10)
			}
			for i := 0; i < 4; i++ {
				requireRow(t, r, "r", i)
				requireRow(t, w, "w", i)
			}
			if got := watermarkMap(t, r.Node)[GroupKey{Site: g.Site, Schema: "app", Table: "t"}]; got == uint64(maxHLC) {
				t.Fatal("the receiver's watermark of the victim's group is the forged maximum")
			}
			in, err := r.Inbound(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range in {
				if st.From == "stranger" {
					t.Fatalf("state kept for an unknown sender: %+v", st)
				}
			}
		})
	}
}

// TestAttackImpersonationCannotResetProgress: m pushes under v's name with
// a fresh log id. v's progress at the receiver must not reset: v's later
// events still raise the receiver's watermark of v's group, and arrive.
func TestAttackImpersonationCannotResetProgress(t *testing.T) {
	m := newTestMesh(t, 32, []string{"v", "r", "m"}, nil)
	m.link("v", "r")
	m.link("m", "r")
	ctx := context.Background()
	v, r := m.nodes["v"], m.nodes["r"]
	upsertN(t, v.Node, 0, 5, "a")
	m.syncAll(10)
	_, _ = m.net.Transport("m").Push(ctx, "r", hostilePush("v", freshLog(9)))
	upsertN(t, v.Node, 5, 5, "a")
	m.syncAll(10)
	for i := 0; i < 10; i++ {
		requireRow(t, r, "r", i)
	}
	k := GroupKey{Site: v.Identity().Site, Schema: "app", Table: "t"}
	if got, want := watermarkMap(t, r.Node)[k], newestOwn(t, v.Node); got < want {
		t.Fatalf("after the impersonation r's watermark of v is %v, below v's newest event %v: progress was reset", messages.HLC(got), messages.HLC(want))
	}
}

// TestAttackInventedGroupClaimsAreNotStored: a configured peer claims
// 12 000 invented groups in three pushes. None is stored or relayed, and
// the real watermarks stay in push results.
func TestAttackInventedGroupClaimsAreNotStored(t *testing.T) {
	m := newTestMesh(t, 33, []string{"v", "r", "m"}, nil)
	m.link("v", "r")
	m.link("m", "r")
	ctx := context.Background()
	v, r := m.nodes["v"], m.nodes["r"]
	upsertN(t, v.Node, 0, 3, "a")
	m.syncAll(10)
	log := freshLog(3)
	for p := 0; p < 3; p++ {
		var cs []messages.WatermarkClaim
		for i := 0; i < 4000; i++ {
			site := messages.SiteID{byte(p), byte(i >> 8), byte(i)}
			cs = append(cs, messages.WatermarkClaim{Group: messages.Group{Site: site, Schema: "inv", Table: fmt.Sprint("t", i)}, HLC: messages.HLC(1 << 40)})
		}
		_, _ = m.net.Transport("m").Push(ctx, "r", hostilePush("m", log, cs...))
	}
	ws, err := r.Watermarks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Group.Schema == "inv" {
			t.Fatalf("an invented group's claim was stored (%d watermarks)", len(ws))
		}
	}
	upsertN(t, v.Node, 3, 1, "a")
	rep, err := v.SyncNow(ctx, "r", "")
	if err != nil || rep.Err != nil {
		t.Fatal(err, rep.Err)
	}
	k := messages.Group{Site: v.Identity().Site, Schema: "app", Table: "t"}
	found := false
	for _, w := range rep.Result.Watermarks {
		found = found || w.Group == k
	}
	if !found || len(rep.Result.Watermarks) > 8 {
		t.Fatalf("push result lists %d watermarks, v's among them: %v", len(rep.Result.Watermarks), found)
	}
}

// TestAttackManyGapsDoNotWedgeABoltLink: an honest peer writes more than
// 4 096 events to a table the receiver (on bbolt) has not defined yet.
// Every later push on the link must succeed, and once the table exists
// the rows arrive.
func TestAttackManyGapsDoNotWedgeABoltLink(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 4 200 events")
	}
	dirs := map[string]string{"a": t.TempDir(), "r": t.TempDir()}
	m := newTestMesh(t, 34, []string{"a", "r"}, func(name string) Config {
		return Config{Dir: dirs[name], NoSync: true, PushBatch: messages.MaxPushEvents}
	})
	m.link("a", "r")
	ctx := context.Background()
	a, r := m.nodes["a"], m.nodes["r"]
	defU := TableDef{Schema: "app", Table: "u", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	a.define(defU)
	const n = 4200
	for i := 0; i < n; i++ {
		if _, err := a.Upsert(ctx, "app", "u", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	for c := 0; c < 3; c++ {
		rep, err := a.SyncNow(ctx, "r", "")
		if err != nil || rep.Err != nil {
			t.Fatalf("cycle %d: the link is wedged: %v %v", c, err, rep.Err)
		}
	}
	upsertN(t, a.Node, 0, 1, "a")
	r.define(defU)
	for c := 0; c < 12; c++ {
		rep, err := a.SyncNow(ctx, "r", "")
		if err != nil || rep.Err != nil {
			t.Fatalf("cycle %d after DefineTable: %v %v", c, err, rep.Err)
		}
		if rep.Done() && rep.Offered == 0 {
			break
		}
	}
	requireRow(t, r, "r", 0)
	got := 0
	if err := r.Scan(ctx, "app", "u", ScanOptions{}, func(Row) bool { got++; return true }); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("r has %d of a's %d rows of app.u", got, n)
	}
}

// TestAttackHeldFloodIsBoundedPerSigner: a trusted signer floods events
// for invented tables. The receiver keeps at most its per-signer quota of
// them (the rest is rejected and re-offered, never stored), and an honest
// peer's events keep applying.
func TestAttackHeldFloodIsBoundedPerSigner(t *testing.T) {
	m := newTestMesh(t, 35, []string{"v", "r", "m"}, nil)
	m.link("v", "r")
	m.link("m", "r")
	ctx := context.Background()
	v, r, h := m.nodes["v"], m.nodes["r"], m.nodes["m"]
	const flood = 3000
	for i := 0; i < flood; i += 500 {
		var evs []messages.PushedEvent
		for j := 0; j < 500; j++ {
			raw, err := h.Sign(&messages.Event{Schema: "inv", Table: fmt.Sprint("t", (i+j)%50), Key: messages.Columns{"id": messages.MustValue(i + j)}, Payload: messages.Columns{"x": messages.MustValue(bytes.Repeat([]byte{1}, 64))}})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, messages.PushedEvent{Seq: uint64(i + j + 1), Raw: raw})
		}
		p := &messages.SyncPush{V: messages.SyncVersion, From: "m", Log: freshLog(5), After: uint64(i), Through: uint64(i + 500), Tail: flood, Events: evs}
		_, _ = m.net.Transport("m").Push(ctx, "r", p)
		// Duplicates of what was held cost a point lookup each.
		_, _ = m.net.Transport("m").Push(ctx, "r", p)
	}
	held, err := r.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if held > 1024 {
		t.Fatalf("the receiver stored %d held events from one signer", held)
	}
	upsertN(t, v.Node, 0, 3, "a")
	m.syncAll(10)
	for i := 0; i < 3; i++ {
		requireRow(t, r, "r", i)
	}
}

// TestAttackSelfChosenNamesKeepNoState: 2 000 pushes under fresh names.
// The receiver keeps no inbound entry and no metric series for any.
func TestAttackSelfChosenNamesKeepNoState(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newTestMesh(t, 36, []string{"v", "r"}, func(name string) Config {
		if name == "r" {
			return Config{Registerer: reg}
		}
		return Config{}
	})
	m.link("v", "r")
	ctx := context.Background()
	series := func() int {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range fams {
			n += len(f.GetMetric())
		}
		return n
	}
	upsertN(t, m.nodes["v"].Node, 0, 2, "a")
	m.syncAll(10)
	before := series()
	for i := 0; i < 2000; i++ {
		name := fmt.Sprint("sybil-", i)
		p := &messages.SyncPush{V: messages.SyncVersion, From: name, Log: freshLog(byte(i)), After: 5, Through: 9, Tail: 9,
			Events: []messages.PushedEvent{{Seq: 7, Raw: []byte{0xff}}}}
		_, _ = m.net.Transport(name).Push(ctx, "r", p)
	}
	in, err := m.nodes["r"].Inbound(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(in) > 1 {
		t.Fatalf("%d inbound entries after pushes from 2 000 unknown names", len(in))
	}
	if after := series(); after > before+4 {
		t.Fatalf("metric series grew from %d to %d", before, after)
	}
	upsertN(t, m.nodes["v"].Node, 2, 1, "a")
	m.syncAll(10)
	requireRow(t, m.nodes["r"], "r", 2)
}

// TestOneCommitPerReceivedPush: a received push's events and the
// receiver's record of it (progress, watermarks) are one bbolt
// transaction — counted by persistence/bolt's DB.Commits.
func TestOneCommitPerReceivedPush(t *testing.T) {
	dirs := map[string]string{"a": t.TempDir(), "r": t.TempDir()}
	m := newTestMesh(t, 37, []string{"a", "r"}, func(name string) Config { return Config{Dir: dirs[name], NoSync: true, PushBatch: 50} })
	m.link("a", "r")
	ctx := context.Background()
	a, r := m.nodes["a"], m.nodes["r"]
	upsertN(t, a.Node, 0, 5, "a")
	m.syncAll(5) // warm: the first push records r's log id, clock and so on
	const pushes = 6
	for p := 0; p < pushes; p++ {
		upsertN(t, a.Node, 10+p*50, 50, "b")
	}
	before := r.db.Commits().Sync
	for p := 0; p < pushes; p++ {
		rep, err := a.SyncNow(ctx, "r", "")
		if err != nil || rep.Err != nil || rep.Offered != 50 {
			t.Fatalf("push %d: %+v %v", p, rep, err)
		}
	}
	if got := r.db.Commits().Sync - before; got != pushes {
		t.Fatalf("%d sync commits on the receiver for %d received pushes, want exactly one each", got, pushes)
	}
	if state(t, a.Node) != state(t, r.Node) {
		t.Fatal("not converged")
	}
}
