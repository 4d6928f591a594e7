package hosting

import (
	"encoding/binary"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/syncmesh/syncmesh/actors/actortest"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestChooseLeader: the highest term wins; at equal terms the member's
// own engine beats a claim; claims older than the leader its engine
// knows are stale, and a term with no known leader hides no claim;
// equal-term claims resolve the same way whatever their order.
func TestChooseLeader(t *testing.T) {
	for _, tc := range []struct {
		name      string
		local     string
		localTerm uint64
		claims    []leadClaim
		want      string
	}{
		{"nothing known", "", 0, nil, ""},
		{"engine only", "b", 4, nil, "b"},
		{"non-voter: a claim", "", 0, []leadClaim{{"c", 3}}, "c"},
		{"newer claim beats the engine", "b", 4, []leadClaim{{"c", 5}}, "c"},
		{"older claim is stale", "b", 4, []leadClaim{{"c", 3}}, "b"},
		{"engine in an election: the claims route", "", 6, []leadClaim{{"c", 5}}, "c"},
		{"engine in an election: claim of its term", "", 6, []leadClaim{{"c", 6}}, "c"},
		{"equal term: engine beats a claim", "b", 4, []leadClaim{{"a", 4}}, "b"},
		{"highest of several", "", 0, []leadClaim{{"a", 2}, {"d", 7}, {"c", 5}}, "d"},
		{"equal-term claims: lowest name", "", 0, []leadClaim{{"d", 7}, {"c", 7}}, "c"},
		{"equal-term claims, other order", "", 0, []leadClaim{{"c", 7}, {"d", 7}}, "c"},
		{"empty claim ignored", "", 0, []leadClaim{{"", 9}}, ""},
	} {
		if got := chooseLeader(tc.local, tc.localTerm, tc.claims); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestLeadsEncoding: what a member publishes decodes to the same leads;
// anything else is refused with errBadLeads.
func TestLeadsEncoding(t *testing.T) {
	in := map[int]uint64{0: 1, 7: 300, 15: 1 << 40}
	b, err := encodeLeads(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeLeads(b)
	if err != nil || !maps.Equal(in, out) {
		t.Fatalf("round trip: %v %v", out, err)
	}
	if b, err := encodeLeads(nil); err != nil || len(b) != 1 {
		t.Fatalf("no leads: %x %v", b, err)
	}
	for _, bad := range []map[int]uint64{{3: 0}, {-1: 2}, {maxLeads: 2}} {
		if _, err := encodeLeads(bad); !errors.Is(err, errBadLeads) {
			t.Errorf("encode %v: %v", bad, err)
		}
	}
	for _, bad := range [][]byte{
		nil,
		{2},                // version
		{1, 3},             // partition without a term
		{1, 3, 0},          // term 0
		{1, 3, 1, 3, 2},    // partition twice
		{1, 5, 1, 3, 2},    // partitions not ascending
		{1, 3, 0x81, 0x00}, // term not minimally encoded
		{1, 0x83, 0x00, 1}, // partition not minimally encoded
		{1, 0x80, 0x80, 0x04, 1},
		binary.AppendUvarint([]byte{1}, maxLeads),
	} {
		if _, err := decodeLeads(bad); !errors.Is(err, errBadLeads) {
			t.Errorf("decode %x: %v, want errBadLeads", bad, err)
		}
	}
}

func FuzzDecodeLeads(f *testing.F) {
	for _, l := range []map[int]uint64{nil, {0: 1}, {2: 9, 40000: 1 << 33}} {
		b, err := encodeLeads(l)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 3, 0x81, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		leads, err := decodeLeads(b)
		if err != nil {
			if !errors.Is(err, errBadLeads) {
				t.Fatalf("error %v is not errBadLeads", err)
			}
			return
		}
		again, err := encodeLeads(leads)
		if err != nil || string(again) != string(b) {
			t.Fatalf("re-encoded %x (%v), decoded from %x", again, err, b)
		}
	})
}

// TestNonVoterRoutesByPublishedLeads: a member whose engine knows no
// leader of a partition (it is none of its voters) routes the
// partition's units, and attributes them (MemberOf), by the leads the
// members in its view published; a claim from a member not in the view
// is ignored, a newer term wins, and a claim older than what its own
// engine observed is stale. What a member publishes is the partitions
// it leads.
func TestNonVoterRoutesByPublishedLeads(t *testing.T) {
	inc, _, _ := replicatedView(t)
	c := inc.c
	c.cur.Store(inc)
	g := "g1"
	p := c.h.repl.partitionOf(unitPath(KindGroup, g))
	publish := func(id string, leads map[int]uint64) { t.Helper(); publishLeads(t, inc, id, leads) }

	if o := inc.owner(KindGroup, g); o != "" {
		t.Fatalf("owner with nothing known: %q", o)
	}
	publish("b@s2@127.0.0.1:9002", map[int]uint64{p: 5})
	if o, m := inc.owner(KindGroup, g), c.MemberOf(KindGroup, g); o != "127.0.0.1:7002" || m != "b" {
		t.Fatalf("b claims term 5: owner %q member %q", o, m)
	}
	// c is not in the view: its claim, however new, routes nothing.
	publish("c@s3@127.0.0.1:9003", map[int]uint64{p: 9})
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7002" {
		t.Fatalf("claim of a member outside the view: owner %q", o)
	}
	inc.onTopology([]*cluster.Member{
		{Id: "a@s1@127.0.0.1:9001", Host: "127.0.0.1", Port: 7001, Kinds: []string{KindGroup}},
		{Id: "b@s2@127.0.0.1:9002", Host: "127.0.0.1", Port: 7002, Kinds: []string{KindGroup}},
		{Id: "c@s3@127.0.0.1:9003", Host: "127.0.0.1", Port: 7003, Kinds: []string{KindGroup}},
	})
	if o, m := inc.owner(KindGroup, g), c.MemberOf(KindGroup, g); o != "127.0.0.1:7003" || m != "c" {
		t.Fatalf("c joined with term 9: owner %q member %q", o, m)
	}
	// b steps down (publishes nothing): c still leads.
	publish("b@s2@127.0.0.1:9002", nil)
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7003" {
		t.Fatalf("after b's empty leads: owner %q", o)
	}
	// This member's engine observed term 10 with b leading: c's claim
	// of term 9 is stale.
	c.lead.step(p, leadInput{change: &leaderChange{partition: p, leader: "b", term: 10}})
	fake := c.h.repl.(*fakeReplicas)
	fake.setLeader(p, "b")
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7002" {
		t.Fatalf("engine's term 10 against a claim of 9: owner %q", o)
	}
	// A malformed value is ignored; the last good one stands.
	inc.onGossip(&cluster.GossipUpdate{MemberID: "c@s3@127.0.0.1:9003", Key: leadsKey, Value: &anypb.Any{TypeUrl: "x", Value: []byte{9}}})
	bad, _ := anypb.New(wrapperspb.Bytes([]byte{1, 3, 0}))
	inc.onGossip(&cluster.GossipUpdate{MemberID: "c@s3@127.0.0.1:9003", Key: leadsKey, Value: bad})
	publish("c@s3@127.0.0.1:9003", map[int]uint64{p: 11})
	if o := inc.owner(KindGroup, g); o != "127.0.0.1:7003" {
		t.Fatalf("c claims term 11: owner %q", o)
	}

	// What this member publishes: the partitions it leads and serves
	// (not before its barrier: routers would only be refused).
	q := 1 - p
	c.lead.step(q, leadInput{change: &leaderChange{partition: q, leader: "a", term: 3, self: true}})
	if got := c.lead.leads(); len(got) != 0 {
		t.Fatalf("leads before the barrier of %d: %v", q, got)
	}
	c.lead.step(q, leadInput{barrier: 3})
	if got := c.lead.leads(); !maps.Equal(got, map[int]uint64{q: 3}) {
		t.Fatalf("leads %v, want {%d: 3}", got, q)
	}
	c.lead.step(q, leadInput{change: &leaderChange{partition: q, leader: "b", term: 4}})
	if got := c.lead.leads(); len(got) != 0 {
		t.Fatalf("leads after losing %d: %v", q, got)
	}
}

// TestRouterRoutesByPublishedLeads: a router-only member of a replicated
// cluster (NoUnits, no engine) sends a unit's requests to the member
// whose published leads claim the unit's partition, not to the member
// its hash picks (which would pass them on, or, while that member's own
// engine still names a leader just killed, send them there); a request
// waiting on a replaced leader is abandoned when the new leader's claim
// arrives, and the claim wakes a request backing off between attempts.
// Before any claim the hash's member is used (its activator passes the
// request on to the leader it knows).
func TestRouterRoutesByPublishedLeads(t *testing.T) {
	c := &Cluster{cfg: ClusterConfig{Replicas: 3, NoUnits: true}, timeout: time.Second, done: make(chan struct{})}
	c.h = newHost(Config{Root: t.TempDir(), MeshID: fenceMesh, NoSync: true}, "127.0.0.1:7009", actortest.System(t), nil)
	t.Cleanup(func() { _ = c.h.close() })
	inc := &incarnation{c: c, self: "127.0.0.1:7009", changed: make(chan struct{})}
	inc.started.Store(true)
	inc.onTopology([]*cluster.Member{
		{Id: "a@s1@127.0.0.1:9001", Host: "127.0.0.1", Port: 7001, Kinds: []string{KindGroup}},
		{Id: "b@s2@127.0.0.1:9002", Host: "127.0.0.1", Port: 7002, Kinds: []string{KindGroup}},
		{Id: "r@s9", Host: "127.0.0.1", Port: 7009},
	})
	c.cur.Store(inc)
	g := "g1"
	hashed := inc.rdv.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: KindGroup, Identity: g})
	other, otherID := "127.0.0.1:7002", "b@s2@127.0.0.1:9002"
	if hashed == other {
		other, otherID = "127.0.0.1:7001", "a@s1@127.0.0.1:9001"
	}
	p := routerPartitionOf(unitPath(KindGroup, g), 0)
	publish := func(id string, leads map[int]uint64) { t.Helper(); publishLeads(t, inc, id, leads) }

	if o := inc.owner(KindGroup, g); o != hashed {
		t.Fatalf("no claim known: owner %q, want the hash's member %q", o, hashed)
	}
	if inc.leaderMoved(KindGroup, g, other) || inc.leaderMoved(KindGroup, g, hashed) {
		t.Fatal("moved while no leader is known")
	}
	publish(otherID, map[int]uint64{p: 5})
	if o := inc.owner(KindGroup, g); o != other {
		t.Fatalf("%s claims partition %d in term 5: owner %q, want %q", otherID, p, o, other)
	}
	if !inc.leaderMoved(KindGroup, g, hashed) || inc.leaderMoved(KindGroup, g, other) {
		t.Fatalf("a request to %s is not redirected to the claimed leader %s", hashed, other)
	}

	// The hash's member wins a later term (the claimant was killed):
	// a waiting request wakes at once.
	lead := c.lead.changes()
	hashedID := "a@s1@127.0.0.1:9001"
	if otherID == hashedID {
		hashedID = "b@s2@127.0.0.1:9002"
	}
	publish(hashedID, map[int]uint64{p: 6})
	select {
	case <-lead:
	case <-time.After(10 * time.Second):
		t.Fatal("a new leader's claim did not wake the requests waiting on a leadership change")
	}
	if o := inc.owner(KindGroup, g); o != hashed || !inc.leaderMoved(KindGroup, g, other) {
		t.Fatalf("term 6 claimed by %s: owner %q", hashedID, o)
	}
	// The same leads again change nothing: no wake.
	lead = c.lead.changes()
	publish(hashedID, map[int]uint64{p: 6})
	select {
	case <-lead:
		t.Fatal("an unchanged claim woke the waiting requests")
	default:
	}
}

// publishLeads delivers member id's published leads to inc as gossip.
func publishLeads(t *testing.T, inc *incarnation, id string, leads map[int]uint64) {
	t.Helper()
	b, err := encodeLeads(leads)
	if err != nil {
		t.Fatal(err)
	}
	v, err := anypb.New(wrapperspb.Bytes(b))
	if err != nil {
		t.Fatal(err)
	}
	inc.onGossip(&cluster.GossipUpdate{MemberID: id, Key: leadsKey, Value: v})
}
