package runtime

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/actors/actortest"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
)

var testMesh = []byte("test-mesh")

// wall is an injectable wall clock that also reads in Unix milliseconds.
type wall struct{ *actortest.Clock }

func newWall() *wall       { return &wall{actortest.NewClock(time.UnixMilli(1_800_000_000_000))} }
func (w *wall) MS() uint64 { return uint64(w.Now().UnixMilli()) }

type testNode struct {
	*Node
	t    *testing.T
	wall *wall
	ctx  context.Context
}

func openTestNode(t *testing.T, cfg Config) *testNode {
	t.Helper()
	w := newWall()
	if cfg.Wall == nil {
		cfg.Wall = w.Now
	}
	if cfg.MeshID == nil {
		cfg.MeshID = testMesh
	}
	if cfg.Dir == "" && !cfg.InMemory {
		cfg.InMemory = true
	}
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return &testNode{Node: n, t: t, wall: w, ctx: context.Background()}
}

var defT = TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b", "c"}}

func (n *testNode) define(def TableDef) {
	n.t.Helper()
	if err := n.DefineTable(n.ctx, def); err != nil {
		n.t.Fatalf("define: %v", err)
	}
}

// apply runs one signed event and fails the test on an infrastructure error.
func (n *testNode) apply(raw []byte) messages.Outcome {
	n.t.Helper()
	out, err := n.ApplySigned(n.ctx, raw)
	if err != nil {
		n.t.Fatalf("apply: %v", err)
	}
	return out
}

func (n *testNode) get(id int) (Row, bool) {
	n.t.Helper()
	r, ok, err := n.Get(n.ctx, "app", "t", map[string]any{"id": id})
	if err != nil {
		n.t.Fatalf("get: %v", err)
	}
	return r, ok
}

// peer is a remote site with its own key.
type peer struct {
	t      *testing.T
	signer *sign.Signer
}

func newPeer(t *testing.T, siteByte byte) *peer {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &peer{t: t, signer: sign.NewSigner(messages.SiteID{siteByte}, priv)}
}

func (p *peer) key() sign.Key { return p.signer.Key() }

func (n *testNode) trust(p *peer) {
	n.t.Helper()
	if err := n.Trust(n.ctx, p.key()); err != nil {
		n.t.Fatalf("trust: %v", err)
	}
}

func hlcAt(ms uint64, logical uint16) messages.HLC {
	h, err := messages.NewHLC(ms, logical)
	if err != nil {
		panic(err)
	}
	return h
}

func (p *peer) upsert(h messages.HLC, id int, cols map[string]any) []byte {
	p.t.Helper()
	payload := messages.Columns{}
	for k, v := range cols {
		payload[k] = messages.MustValue(v)
	}
	return p.event(&messages.Event{HLC: h, Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(id)}, Payload: payload})
}

func (p *peer) del(h messages.HLC, id int) []byte {
	p.t.Helper()
	return p.event(&messages.Event{HLC: h, Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(id)}, Delete: true})
}

func (p *peer) event(e *messages.Event) []byte {
	p.t.Helper()
	e.Site = p.signer.Site()
	raw, err := p.signer.Sign(e, testMesh)
	if err != nil {
		p.t.Fatalf("sign: %v", err)
	}
	return raw
}

// rawEvent signs a hand-built event map (for payloads Event cannot express).
func (p *peer) rawEvent(m map[string]any) []byte {
	p.t.Helper()
	opts := cbor.CoreDetEncOptions()
	em, _ := opts.EncMode()
	b, err := em.Marshal(m)
	if err != nil {
		p.t.Fatal(err)
	}
	raw, err := p.signer.SignPayload(b, testMesh)
	if err != nil {
		p.t.Fatal(err)
	}
	return raw
}

// notices collects a node's notices.
type notices struct {
	mu  sync.Mutex
	all []messages.Notice
}

func (n *testNode) collect() *notices {
	c := &notices{}
	cancel := n.Subscribe(func(x messages.Notice) { c.mu.Lock(); c.all = append(c.all, x); c.mu.Unlock() })
	n.t.Cleanup(cancel)
	return c
}

// waitFor polls until pred holds on the collected notices (delivery is
// asynchronous: a mailbox per subscriber).
func (c *notices) waitFor(t *testing.T, what string, pred func(messages.Notice) bool) messages.Notice {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, x := range c.all {
			if pred(x) {
				c.mu.Unlock()
				return x
			}
		}
		c.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("no %s notice arrived", what)
	return nil
}

func cellString(t *testing.T, r Row, col string) (string, CellState) {
	t.Helper()
	var s *string
	st, err := r.Value(col, &s)
	if err != nil {
		t.Fatalf("decode %s: %v", col, err)
	}
	if s == nil {
		return "<nil>", st
	}
	return *s, st
}

func sameCell(a, b Cell) bool {
	return a.State == b.State && a.Value.Equal(b.Value) && a.Clock == b.Clock
}

// nodeWithPeer opens a node with table app.t defined and one trusted peer.
func nodeWithPeer(t *testing.T, cfg Config) (*testNode, *peer) {
	t.Helper()
	n := openTestNode(t, cfg)
	n.define(defT)
	p := newPeer(t, 1)
	n.trust(p)
	return n, p
}
