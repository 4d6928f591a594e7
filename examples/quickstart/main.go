// Command quickstart is the README's main job (`make run`): two syncmesh
// nodes in one process, each on its own embedded bbolt store, writing to
// the same replicated table, pushing their signed event logs to each
// other, and converging — concurrent edits of different columns both
// kept, a delete racing a later edit surfaced as a resurrection, a forged
// event dropped — then an end-to-end encrypted message sent, received,
// committed and acknowledged.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

func main() {
	dir := flag.String("dir", "", "keep the two nodes' data here (default: a temporary directory, removed at exit)")
	flag.Parse()
	if err := run(context.Background(), *dir); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

type node struct {
	name string
	*runtime.Node
}

func run(ctx context.Context, dir string) error {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-quickstart-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	mesh := []byte("quickstart-mesh")
	// The in-process transport; across processes it is runtime.StartRemote
	// (see examples/mesh). Sync cycles run when syncBoth says so here, to
	// print them; by default they run on a timer (Config.SyncInterval).
	network := runtime.NewNetwork(1)
	open := func(name string) (*node, error) {
		// Each node is also a device: the delivery plane shares its actor
		// system, its bbolt file and the network.
		addr := runtime.DeviceAddress{User: name, Device: 1}
		n, err := runtime.Open(ctx, runtime.Config{Dir: dir + "/" + name, MeshID: mesh, Name: name, SyncInterval: -1,
			Device: &runtime.DeviceConfig{Address: addr, Transport: network.DeviceTransport(name, addr), Buffer: 8}})
		if err != nil {
			return nil, err
		}
		network.Register(name, n)
		network.RegisterDevice(name, n)
		return &node{name: name, Node: n}, nil
	}
	alice, err := open("alice")
	if err != nil {
		return err
	}
	defer alice.Close()
	bob, err := open("bob")
	if err != nil {
		return err
	}
	defer bob.Close()

	step("1. Two nodes, each with its own bbolt file and Ed25519 signing key")
	for _, n := range []*node{alice, bob} {
		id := n.Identity()
		fmt.Printf("   %-5s site %s  kid %x\n", n.name, id.Site, id.Kid)
	}
	// Each trusts the other's key: events are attributed by signature.
	for _, pair := range [][2]*node{{alice, bob}, {bob, alice}} {
		id := pair[1].Identity()
		if err := pair[0].Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
			return err
		}
	}
	if err := alice.AddPeer("bob", network.Transport("alice"), ""); err != nil {
		return err
	}
	if err := bob.AddPeer("alice", network.Transport("bob"), ""); err != nil {
		return err
	}
	for _, n := range []*node{alice, bob} {
		if err := startTables(ctx, n.Node); err != nil {
			return err
		}
	}
	notices := make(chan string, 16)
	bob.Subscribe(func(x messages.Notice) {
		if r, ok := x.(messages.Resurrection); ok {
			notices <- fmt.Sprintf("resurrection of todo %s (tombstone %v beaten by %v)", keyString(r.Key), r.Tomb.HLC, r.By.HLC)
		}
	})

	step("2. Each writes locally (signed events, durable before the call returns)")
	must(alice.Upsert(ctx, "app", "todos", key(1), map[string]any{"title": "buy milk", "done": false}))
	must(bob.Upsert(ctx, "app", "todos", key(2), map[string]any{"title": "call mum", "done": false}))
	if err := syncBoth(ctx, alice, bob); err != nil {
		return err
	}

	step("3. Concurrent edits of different columns of one row: both survive (per-column LWW)")
	must(alice.Upsert(ctx, "app", "todos", key(1), map[string]any{"done": true}))
	must(bob.Upsert(ctx, "app", "todos", key(1), map[string]any{"note": "oat milk", "title": "buy oat milk"}))
	if err := syncBoth(ctx, alice, bob); err != nil {
		return err
	}

	step("4. Bob deletes todo 2 while Alice, later, edits it: the later write resurrects the row")
	must(bob.Delete(ctx, "app", "todos", key(2)))
	time.Sleep(2 * time.Millisecond) // Alice's edit is later in HLC order
	must(alice.Upsert(ctx, "app", "todos", key(2), map[string]any{"done": true}))
	if err := syncBoth(ctx, alice, bob); err != nil {
		return err
	}
	select {
	case s := <-notices:
		fmt.Println("   bob was notified:", s)
	case <-time.After(2 * time.Second):
		return fmt.Errorf("no resurrection notice")
	}

	step("5. A forged event (a key nobody trusts) is dropped at the chokepoint")
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	mallory := sign.NewSigner(messages.SiteID{0x66}, priv)
	h, _ := alice.NextHLC()
	forged, err := mallory.Sign(&messages.Event{Site: mallory.Site(), HLC: h, Schema: "app", Table: "todos",
		Key: messages.Columns{"id": messages.MustValue(1)}, Payload: messages.Columns{"title": messages.MustValue("pwned")}}, mesh)
	if err != nil {
		return err
	}
	out, err := bob.ApplySigned(ctx, forged)
	if err != nil {
		return err
	}
	fmt.Println("   outcome:", out)

	step("6. Both nodes hold the same rows; each knows how far the other is (watermarks)")
	a, b := dump(ctx, alice), dump(ctx, bob)
	fmt.Print(a)
	if a != b {
		fmt.Print("   bob:\n" + b)
		return fmt.Errorf("the nodes diverged")
	}
	fmt.Println("   converged: alice and bob are identical")
	peers, err := alice.Peers(ctx)
	if err != nil {
		return err
	}
	for _, p := range peers {
		fmt.Printf("   alice → %s: cursor %d of %d, %d to re-offer, %d watermarks reported\n", p.Peer, p.Cursor, p.Tail, p.Retry, len(p.Watermarks))
	}
	return message(ctx, network, alice, bob)
}

// todos is the application's table as this build knows it.
var todos = runtime.TableDef{Schema: "app", Table: "todos", KeyColumns: []string{"id"}, Columns: []string{"title", "done", "note"}}

// startTables is the application's start-up schema step. EnsureTable, not
// DefineTable: it adds what this build's definition has and the store
// lacks, and accepts a store that is ahead (a column added by a newer
// release, then rolled back), so a restart never fails on the schema.
func startTables(ctx context.Context, n *runtime.Node) error {
	return n.EnsureTable(ctx, todos)
}

// message is the delivery plane: an end-to-end encrypted message that
// stays pending at the receiver until its application commits it; only
// then is it acknowledged, and only the ACK clears it at the sender.
func message(ctx context.Context, network *runtime.Network, alice, bob *node) error {
	step("7. Alice sends Bob an end-to-end encrypted message (PQXDH session, Double Ratchet)")
	sent, err := alice.Send(ctx, bob.DeviceAddress(), []byte("dinner at 8?"))
	if err != nil {
		return err
	}
	fmt.Printf("   sent id %s: pending at alice until bob's ACK\n", sent.ID)
	var m runtime.ReceivedMessage
	select {
	case m = <-bob.Messages():
	case <-time.After(10 * time.Second):
		return fmt.Errorf("bob received nothing")
	}
	pending, err := bob.PendingReceivedMessageCount(ctx, nil)
	if err != nil {
		return err
	}
	fmt.Printf("   bob received %q from %s (sequence %d); pending at bob: %d (survives a crash, delivered again on open)\n", m.Plaintext, m.Sender, m.Sequence, pending)

	step("8. Bob's application commits it: the ACK goes out only now")
	res, err := bob.CommitMessage(ctx, m)
	if err != nil {
		return err
	}
	if err := network.Flush(ctx); err != nil {
		return err
	}
	left := 0
	for _, err := range alice.PendingSent(ctx, 0, nil) {
		if err != nil {
			return err
		}
		left++
	}
	again, err := bob.CommitMessage(ctx, m)
	if err != nil {
		return err
	}
	fmt.Printf("   bob: %s (ACK sent: %v); alice: %d messages still waiting for an ACK\n", res.Status, res.AckSent, left)
	fmt.Printf("   committing again is harmless: %s\n", again.Status)
	if left != 0 || res.Status != runtime.Committed {
		return fmt.Errorf("the message was not acknowledged")
	}
	return nil
}

func step(s string) { fmt.Println("\n" + s) }

func key(id int) map[string]any { return map[string]any{"id": id} }

func must(o messages.Outcome, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
	if o.Kind != messages.Applied {
		fmt.Fprintln(os.Stderr, "quickstart: unexpected outcome", o)
		os.Exit(1)
	}
}

// syncBoth runs one push cycle each way (SSP/1 §14): each node offers
// the other what lies past its durable cursor for that peer.
func syncBoth(ctx context.Context, a, b *node) error {
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		from, to := p[0], p[1]
		rep, err := from.SyncNow(ctx, to.name, "")
		if err != nil {
			return err
		}
		if rep.Err != nil {
			return rep.Err
		}
		fmt.Printf("   %s → %s: log entries %d..%d: %d offered, %d applied or already held\n",
			from.name, to.name, rep.After+1, rep.Through, rep.Offered, rep.Result.Applied)
	}
	return nil
}

func keyString(k messages.Columns) string {
	var id int
	_ = k["id"].Decode(&id)
	return fmt.Sprint(id)
}

func dump(ctx context.Context, n *node) string {
	var b strings.Builder
	for r, err := range n.Rows(ctx, "app", "todos", runtime.ScanOptions{IncludeDeleted: true}) {
		if err != nil {
			fmt.Fprintf(&b, "   (read failed: %v)\n", err)
			break
		}
		fmt.Fprintf(&b, "   todo %s exists=%v\n", keyString(r.Key), r.Exists)
		cols := make([]string, 0, len(r.Cells))
		for c := range r.Cells {
			cols = append(cols, c)
		}
		sort.Strings(cols)
		for _, c := range cols {
			cell := r.Cells[c]
			v := "—"
			if cell.State != runtime.Unmaterialized {
				x, _ := cell.Value.Interface()
				v = fmt.Sprintf("%v", x)
			}
			fmt.Fprintf(&b, "     %-6s %-14s (%s)\n", c, v, cell.State)
		}
	}
	return b.String()
}
