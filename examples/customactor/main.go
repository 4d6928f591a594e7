// Command customactor shows how to run an application actor on a syncmesh
// node's actor system, fed by both planes, calling the node's API: here an
// actor that commits each delivered message after writing it into a
// synced table, so the delivery plane feeds the sync plane.
//
// # The pattern
//
// Spawn: a node runs its actors on a protoactor-go actor system,
// Node.System() (its own, or Config.System shared by many nodes). Spawn
// application actors there after Open:
//
//	pid := n.System().Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return a }))
//
// The actor's lifetime is the node's: Node.Close stops the actors
// subscribed with SubscribePID and, when the node owns its system, every
// actor on it. Spawn a new one after the next Open.
//
// What the actor gets:
//
//   - Deliveries. DeviceConfig.Handler is called with every Delivery, one
//     at a time, in order (new messages, redeliveries, and on Open every
//     message still pending). Make the Handler forward to the actor with
//     RequestFuture and wait for the answer: the mailbox then sees the
//     deliveries in order, and the device does not hand the next one
//     before the actor is done (backpressure). The Handler exists before
//     the node, and Open already calls it for pending messages, so it
//     waits until the actor is spawned (type inbox). Node.Messages()
//     (DeviceConfig.Buffer) pumped by a goroutine into the actor works
//     the same way.
//   - Notices. Node.SubscribePID(pid) sends the actor every notice of
//     this node as a runtime.NoticeEvent (resurrections, partial
//     rebuilds, dropped, rejected and held events, ignored columns,
//     released groups); several nodes sharing a system each publish their
//     own, tagged with NoticeEvent.Node.
//   - Its own requests (here statsRequest), answered with Respond.
//
// Calling the node: the actor may call the node's API (Upsert, Get,
// CommitMessage, Send, ...) from Receive. Those calls are answered by the
// node's own actors, separate mailboxes, so a blocking call only
// serializes this actor; bound each with a context timeout.
//
// # Why commit after write
//
// The commit is the delivery plane's point of no return: it finalizes the
// message and sends the ACK, after which the sender forgets it and nothing
// redelivers it. So the application applies the message first, then
// commits. A crash between the two leaves the message pending: it is
// delivered again on the next Open and applied again. For that second
// application to be harmless the write must be idempotent: this actor
// keys the row by the message's identity (sender, logical id) and writes
// only values fixed by the message (body, and ReceivedAt, which is the
// same on every redelivery), so a rewrite lands on the same row with the
// same values. The reverse order would lose the message on a crash
// between commit and write. The demo runs that crash (bob's node is
// closed between the write and the commit of the second message and
// reopened from its bbolt file) and shows the rewrite converges to one
// row, the commit happens after restart, and the sender gets its ACK.
//
// Then the table syncs: bob pushes inbox.messages to alice, whose node
// runs a newer schema with a "note" column; alice annotates a row and
// pushes back; bob's node ignores the unknown column and the actor hears
// about it through a ColumnsIgnored notice.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

var meshID = []byte("customactor-demo")

func main() {
	dir := flag.String("dir", "", "keep bob's bbolt node here (default: a temporary directory, removed at exit)")
	flag.Parse()
	if _, err := run(context.Background(), *dir, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "customactor:", err)
		os.Exit(1)
	}
}

// outcome is what run observed, for the test.
type outcome struct {
	// AliceRows are the bodies of the rows of inbox.messages on alice
	// (the sync peer), by message id.
	AliceRows map[runtime.MessageID]string
	// BobRows counts the rows of inbox.messages on bob.
	BobRows int
	// BobPending and AlicePendingSent are the pending counts at the end.
	BobPending, AlicePendingSent int
	// Writes and Commits are the actor's counters after the restart (the
	// redelivered message: one write, one commit) and before it.
	WritesBefore, CommitsBefore, WritesAfter, CommitsAfter int
	// Processed is bob's processed record of each message.
	Processed map[runtime.MessageID]runtime.ProcessedMessage
	// Notices are the notices bob's actor received.
	Notices []messages.Notice
	// Offered is how many events bob pushed to alice; AliceChanges the
	// row changes alice's Watch reported for them.
	Offered      int
	AliceChanges []runtime.Change
	BobSite      messages.SiteID
}

type demo struct {
	say    func(string, ...any)
	net    *runtime.Network
	alice  *runtime.Node
	bob    *runtime.Node
	bobDir string
	inbox  *inbox
}

var (
	aliceAddr = runtime.DeviceAddress{User: "alice", Device: 1}
	bobAddr   = runtime.DeviceAddress{User: "bob", Device: 1}
)

func run(ctx context.Context, dir string, w io.Writer) (outcome, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-customactor-")
		if err != nil {
			return outcome{}, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	d := &demo{say: printer(w), net: runtime.NewNetwork(1), bobDir: dir}
	defer d.close()
	var out outcome
	if err := d.steps(ctx, &out); err != nil {
		return out, err
	}
	return out, nil
}

func (d *demo) close() {
	if d.bob != nil {
		_ = d.bob.Close()
	}
	if d.alice != nil {
		_ = d.alice.Close()
	}
}

// openBob opens bob's node (both planes, bbolt) and spawns its actor.
func (d *demo) openBob(ctx context.Context, crash func(runtime.ReceivedMessage) bool) error {
	d.inbox = newInbox()
	n, err := runtime.Open(ctx, runtime.Config{
		Dir: d.bobDir, MeshID: meshID, Name: "bob", SyncInterval: -1,
		Device: &runtime.DeviceConfig{Address: bobAddr, Transport: d.net.DeviceTransport("bob", bobAddr), Handler: d.inbox.handler},
	})
	if err != nil {
		return err
	}
	d.bob = n
	if err := n.DefineTable(ctx, inboxDef); err != nil {
		return err
	}
	d.net.Register("bob", n)
	d.net.RegisterDevice("bob", n)
	if err := n.AddPeer("alice", d.net.Transport("bob"), ""); err != nil && !errors.Is(err, runtime.ErrPeerExists) {
		return err
	}
	pid := d.inbox.spawn(n, &inboxActor{say: d.say, crashAfterWrite: crash})
	d.say("bob: node open (site %s), actor %s spawned on n.System(), subscribed to bob's notices", n.Identity().Site.String()[:8], pid.Id)
	return nil
}

func (d *demo) steps(ctx context.Context, out *outcome) error {
	say := d.say
	var err error
	d.alice, err = runtime.Open(ctx, runtime.Config{
		InMemory: true, MeshID: meshID, Name: "alice", SyncInterval: -1,
		Device: &runtime.DeviceConfig{Address: aliceAddr, Transport: d.net.DeviceTransport("alice", aliceAddr)},
	})
	if err != nil {
		return err
	}
	if err := d.alice.DefineTable(ctx, inboxDefNewer); err != nil {
		return err
	}
	d.net.Register("alice", d.alice)
	d.net.RegisterDevice("alice", d.alice)
	if err := d.alice.AddPeer("bob", d.net.Transport("alice"), ""); err != nil {
		return err
	}
	say("-- 0. alice: in-memory node, schema with a \"note\" column; bob: bbolt node, older schema, an inbox actor")
	// The second message's id is chosen now, so the crash hook only reads it.
	var second runtime.MessageID
	if _, err := rand16(&second); err != nil {
		return err
	}
	crash := func(m runtime.ReceivedMessage) bool { return m.ID == second }
	if err := d.openBob(ctx, crash); err != nil {
		return err
	}
	for _, p := range [][2]*runtime.Node{{d.alice, d.bob}, {d.bob, d.alice}} {
		id := p[1].Identity()
		if err := p[0].Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
			return err
		}
	}

	say("\n-- 1. alice sends a message; bob's actor writes it into inbox.messages, then commits it")
	first, err := d.alice.Send(ctx, bobAddr, []byte("hello bob"))
	if err != nil {
		return err
	}
	say("alice: sent %s %q", short(first.ID), "hello bob")
	if err := d.waitAcked(ctx, first.ID); err != nil {
		return err
	}
	say("alice: ACK for %s received: nothing pending", short(first.ID))

	say("\n-- 2. a second message; bob crashes between the write and the commit")
	if _, err := d.alice.SendWithID(ctx, bobAddr, second, []byte("are you there?")); err != nil {
		return err
	}
	say("alice: sent %s %q", short(second), "are you there?")
	if err := waitFor(ctx, func() (bool, error) {
		s, err := d.inbox.stats()
		return s.Writes == 2, err
	}); err != nil {
		return fmt.Errorf("second write: %w", err)
	}
	before, err := d.inbox.stats()
	if err != nil {
		return err
	}
	out.WritesBefore, out.CommitsBefore = before.Writes, before.Commits
	pending, err := d.bob.PendingReceivedMessageCount(ctx, nil)
	if err != nil {
		return err
	}
	say("bob: %d message pending (written, not committed); stopping the node (a kill leaves the same durable state: the row written, the message pending)", pending)
	if err := d.bob.Close(); err != nil {
		return err
	}
	d.net.UnregisterDevice(bobAddr)
	d.net.Unregister("bob")
	say("bob: reopening from %s", d.bobDir)
	if err := d.openBob(ctx, nil); err != nil {
		return err
	}
	if err := d.waitAcked(ctx, second); err != nil {
		return err
	}
	after, err := d.inbox.stats()
	if err != nil {
		return err
	}
	out.WritesAfter, out.CommitsAfter = after.Writes, after.Commits
	say("alice: ACK for %s received after bob's restart (the new actor wrote it again: %d write, %d commit)", short(second), after.Writes, after.Commits)

	say("\n-- 3. the table syncs: bob pushes inbox.messages to alice")
	rep, err := d.bob.SyncNow(ctx, "alice", "")
	if err != nil || rep.Err != nil {
		return fmt.Errorf("bob → alice: %v %v", err, rep.Err)
	}
	say("bob → alice: %d events offered (the second message's row was written twice), done %v", rep.Offered, rep.Done())
	out.AliceRows = map[runtime.MessageID]string{}
	for r, err := range d.alice.Rows(ctx, inboxSchema, inboxTable, runtime.ScanOptions{}) {
		if err != nil {
			return err
		}
		var sender, id, body string
		_ = r.Key["sender"].Decode(&sender)
		_ = r.Key["id"].Decode(&id)
		_, _ = r.Value("body", &body)
		var mid runtime.MessageID
		if err := parseID(id, &mid); err == nil {
			out.AliceRows[mid] = body
		}
		say("alice: row inbox.messages (%s, %s…) body=%q", sender, id[:8], body)
	}
	for _, err := range d.bob.Rows(ctx, inboxSchema, inboxTable, runtime.ScanOptions{}) {
		if err != nil {
			return err
		}
		out.BobRows++
	}
	say("bob: %d rows in inbox.messages (the rewrite after the crash landed on the same row)", out.BobRows)
	out.Offered, out.BobSite = rep.Offered, d.bob.Identity().Site
	if out.AliceChanges, err = changesOf(ctx, d.alice); err != nil {
		return err
	}
	for _, c := range out.AliceChanges {
		var id string
		_ = c.Key["id"].Decode(&id)
		say("alice: watch: change %d, row %s…, %v from site %s at %v, %d cell(s) changed", c.Seq, id[:8], c.Cause, c.Event.Site.String()[:8], c.Event.HLC, len(c.Cells))
	}

	say("\n-- 4. alice (newer schema) annotates a row and pushes back; bob's actor gets a notice")
	if _, err := d.alice.Upsert(ctx, inboxSchema, inboxTable, map[string]any{"sender": aliceAddr.String(), "id": first.ID.String()}, map[string]any{"note": "read"}); err != nil {
		return err
	}
	if rep, err := d.alice.SyncNow(ctx, "bob", ""); err != nil || rep.Err != nil {
		return fmt.Errorf("alice → bob: %v %v", err, rep.Err)
	}
	if err := waitFor(ctx, func() (bool, error) {
		s, err := d.inbox.stats()
		return len(s.Notices) > 0, err
	}); err != nil {
		return fmt.Errorf("notice: %w", err)
	}
	st, err := d.inbox.stats()
	if err != nil {
		return err
	}
	out.Notices = st.Notices

	say("\n-- 5. final state")
	if out.BobPending, err = d.bob.PendingReceivedMessageCount(ctx, nil); err != nil {
		return err
	}
	for _, err := range d.alice.PendingSent(ctx, 0, nil) {
		if err != nil {
			return err
		}
		out.AlicePendingSent++
	}
	out.Processed = map[runtime.MessageID]runtime.ProcessedMessage{}
	for _, id := range []runtime.MessageID{first.ID, second} {
		p, ok, err := d.bob.ProcessedMessage(ctx, aliceAddr, id)
		if err != nil {
			return err
		}
		if ok {
			out.Processed[id] = p
		}
	}
	say("bob: %d pending received; alice: %d pending sent; alice's table: %d rows; bob's actor: %d notice(s)",
		out.BobPending, out.AlicePendingSent, len(out.AliceRows), len(out.Notices))
	return nil
}

// waitAcked waits until alice has no pending sent message id (its ACK
// arrived).
func (d *demo) waitAcked(ctx context.Context, id runtime.MessageID) error {
	return waitFor(ctx, func() (bool, error) {
		if err := d.net.Flush(ctx); err != nil {
			return false, err
		}
		for m, err := range d.alice.PendingSent(ctx, 0, &bobAddr) {
			if err != nil {
				return false, err
			}
			if m.ID == id {
				return false, nil
			}
		}
		return true, nil
	})
}

// waitFor polls cond until it holds (10 s at most).
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// changesOf reads every change of inbox.messages on n so far with Watch,
// as a cache or a UI would, stopping at the newest (Watch would otherwise
// wait for the next one). A real consumer keeps the last Seq it processed
// and resumes after it on its next start.
func changesOf(ctx context.Context, n *runtime.Node) ([]runtime.Change, error) {
	last, err := n.LastChangeSeq(ctx)
	if err != nil || last == 0 {
		return nil, err
	}
	var out []runtime.Change
	for c, err := range n.Watch(ctx, inboxSchema, inboxTable, 0) {
		if err != nil {
			return out, err
		}
		out = append(out, c)
		if c.Seq >= last {
			break
		}
	}
	return out, nil
}

func rand16(id *runtime.MessageID) (int, error) { return rand.Read(id[:]) }

// parseID decodes a logical message id from its hex form (MessageID.String).
func parseID(s string, id *runtime.MessageID) error {
	b, err := hex.DecodeString(s)
	if err != nil {
		return err
	}
	if len(b) != len(id) {
		return fmt.Errorf("customactor: message id of %d bytes", len(b))
	}
	copy(id[:], b)
	return nil
}
