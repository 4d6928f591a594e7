package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// noticeLog collects a node's notices of the kinds a restore test checks.
type noticeLog struct {
	mu             sync.Mutex
	undecryptable  []messages.UndecryptableEnvelope
	repairs        []messages.SessionRepaired
	restoreNotices []messages.RestoreDetected
}

func (l *noticeLog) watch(n *Node) func() {
	return n.Subscribe(func(x messages.Notice) {
		l.mu.Lock()
		defer l.mu.Unlock()
		switch v := x.(type) {
		case messages.UndecryptableEnvelope:
			l.undecryptable = append(l.undecryptable, v)
		case messages.SessionRepaired:
			l.repairs = append(l.repairs, v)
		case messages.RestoreDetected:
			l.restoreNotices = append(l.restoreNotices, v)
		}
	})
}

func (l *noticeLog) counts() (undecryptable int, repairs []messages.SessionRepaired) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.undecryptable), append([]messages.SessionRepaired(nil), l.repairs...)
}

// receiveCommit waits for one message at n and commits it.
func receiveCommit(t *testing.T, n *testNode, want string) ReceivedMessage {
	t.Helper()
	select {
	case m := <-n.Messages():
		if string(m.Plaintext) != want {
			t.Fatalf("delivered %q, want %q", m.Plaintext, want)
		}
		if res, err := n.CommitMessage(context.Background(), m); err != nil || res.Status != Committed {
			t.Fatalf("commit %q: %+v %v", want, res, err)
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatalf("%q never delivered", want)
	}
	return ReceivedMessage{}
}

// TestDeliveryOnlyRestoreIsDetectedAndReinitiatesBeforeSending: alice's
// node.db is restored from a copy taken before she exchanged two more
// messages with bob; no sync-plane write happened in between, so the
// clock mark did not move and says nothing. The delivery mark does:
// alice's Open reports the restore (RestoreStatus.DeliverySuspected,
// syncmesh_restore_detected_total{plane="delivery",evidence="mark"}),
// and her next message goes out on a fresh session, so bob never sees an
// envelope he cannot decrypt and never has to repair. Without the mark
// her stale session reused chain positions bob had consumed: bob refused
// them as replays until his repair.
func TestDeliveryOnlyRestoreIsDetectedAndReinitiatesBeforeSending(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	openAlice := func() *testNode {
		a := openTestNode(t, Config{Name: "alice", Dir: dir, NoSync: true, SyncInterval: -1,
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
		net.Register(a.Name(), a.Node)
		net.RegisterDevice(a.Name(), a.Node)
		return a
	}
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr,
		Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	net.Register(bob.Name(), bob.Node)
	net.RegisterDevice(bob.Name(), bob.Node)
	var bobLog noticeLog
	defer bobLog.watch(bob.Node)()

	alice := openAlice()
	send := func(body string) {
		t.Helper()
		if _, err := alice.Send(ctx, bAddr, []byte(body)); err != nil {
			t.Fatal(err)
		}
		receiveCommit(t, bob, body)
		if err := net.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	send("before the copy")
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "node.db")
	copyFile(t, filepath.Join(dir, "node.db"), backup)

	alice = openAlice()
	if st := alice.RestoreStatus(); st.DeliverySuspected || st.Suspected {
		t.Fatalf("a plain restart looks restored: %+v", st)
	}
	send("after the copy 1")
	send("after the copy 2")
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	copyFile(t, backup, filepath.Join(dir, "node.db"))
	if _, err := os.Stat(filepath.Join(dir, clockMarkName)); err != nil {
		t.Fatalf("setup: %v", err)
	}

	alice = openAlice()
	st := alice.RestoreStatus()
	if !st.DeliverySuspected || st.DeliveryFileMark <= st.DeliveryStoreMark {
		t.Fatalf("the restored node.db is not detected on the delivery plane: %+v", st)
	}
	if st.Suspected {
		t.Fatalf("setup: the clock mark saw the restore (the test is about the delivery mark alone): %+v", st)
	}
	if got := labeledCounter(t, alice, "syncmesh_restore_detected_total", map[string]string{"plane": "delivery", "evidence": "mark"}); got != 1 {
		t.Fatalf("syncmesh_restore_detected_total{delivery,mark} = %v, want 1", got)
	}
	before, _ := bobLog.counts()
	send("after the restore")
	undecryptable, repairs := bobLog.counts()
	if undecryptable != before {
		t.Fatalf("bob could not decrypt %d envelopes of the restored alice (repairs at bob: %+v)", undecryptable-before, repairs)
	}
	for _, r := range repairs {
		if r.Step == "started" {
			t.Fatalf("bob had to repair the session: %+v", repairs)
		}
	}
	if p, _ := alice.PendingSentMessages(ctx, 0, 10, nil); len(p.Messages) != 0 {
		t.Fatalf("alice still has %d pending sent", len(p.Messages))
	}
	// The store was brought up to the mark: the next Open is a plain one.
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	alice = openAlice()
	if st := alice.RestoreStatus(); st.DeliverySuspected {
		t.Fatalf("the restore is reported again on the next Open: %+v", st)
	}
}

// TestDeliveryMarkMissingOrDamagedCountsAsRestore: a store that wrote
// sessions opened without its delivery mark (a copy opened as a new
// directory) or with a damaged one is treated as restored; a fresh
// directory is not.
func TestDeliveryMarkMissingOrDamagedCountsAsRestore(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage func(path string)
		reason string
	}{
		{"missing", func(p string) { _ = os.Remove(p) }, "delivery mark file missing beside a store with sessions"},
		{"damaged", func(p string) { _ = os.WriteFile(p, []byte("smdeliv1 not a mark"), 0o600) }, "delivery mark file damaged"},
		{"other magic", func(p string) { b := encodeDeliveryMark(5); b[0] ^= 1; _ = os.WriteFile(p, b, 0o600) }, "delivery mark file damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			net := NewNetwork(1)
			dir := t.TempDir()
			aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
			open := func() *testNode {
				a := openTestNode(t, Config{Name: "alice", Dir: dir, NoSync: true, SyncInterval: -1,
					Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
				net.Register(a.Name(), a.Node)
				net.RegisterDevice(a.Name(), a.Node)
				return a
			}
			bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr,
				Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
			net.Register(bob.Name(), bob.Node)
			net.RegisterDevice(bob.Name(), bob.Node)
			alice := open()
			if st := alice.RestoreStatus(); st.DeliverySuspected {
				t.Fatalf("a fresh directory looks restored: %+v", st)
			}
			if _, err := alice.Send(ctx, bAddr, []byte("x")); err != nil {
				t.Fatal(err)
			}
			receiveCommit(t, bob, "x")
			if err := alice.Close(); err != nil {
				t.Fatal(err)
			}
			tc.damage(filepath.Join(dir, deliveryMarkName))
			alice = open()
			if st := alice.RestoreStatus(); !st.DeliverySuspected || st.DeliveryReason != tc.reason {
				t.Fatalf("status %+v, want suspected with reason %q", st, tc.reason)
			}
		})
	}
}

func TestDeliveryMarkEncoding(t *testing.T) {
	for _, v := range []uint64{0, 1, 1 << 40, ^uint64(0)} {
		got, err := decodeDeliveryMark(encodeDeliveryMark(v))
		if err != nil || got != v {
			t.Fatalf("round trip %d: %d %v", v, got, err)
		}
	}
	b := encodeDeliveryMark(7)
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x40
		if _, err := decodeDeliveryMark(c); err == nil {
			t.Fatalf("a flipped byte %d decodes", i)
		}
	}
	if _, err := decodeDeliveryMark(b[:len(b)-1]); err == nil {
		t.Fatal("a short mark decodes")
	}
}

func FuzzDecodeDeliveryMark(f *testing.F) {
	f.Add(encodeDeliveryMark(3))
	f.Add([]byte("smdeliv1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeDeliveryMark(b)
		if err == nil && string(encodeDeliveryMark(v)) != string(b) {
			t.Fatalf("%x decodes to %d, which encodes otherwise", b, v)
		}
	})
}

// labeledCounter sums the counters called name whose labels include want.
func labeledCounter(t *testing.T, n *testNode, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metrics
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// copyDir copies every regular file of src into dst (a whole node
// directory, marks included: a backup).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			copyFile(t, filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
			if err := os.Chmod(filepath.Join(dst, e.Name()), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWholeDirectoryRestoreFoundByPeerEvidence: a's whole directory —
// node.db, clock.mark, changes.mark and delivery.mark together — is
// restored from a backup taken before it wrote rows 10–14 (synced to b)
// and exchanged messages with b, and it is opened without
// Config.Restored: no mark can tell. Its first reconciliation with b
// returns its own events that the copy lacks, which is the evidence:
// RestoreStatus.Suspected with the peer reason, a RestoreDetected notice,
// syncmesh_restore_detected_total{plane="sync",evidence="peer"}; its
// next message to b goes out on a fresh session (b never sees an
// envelope it cannot decrypt); its writes are above every HLC it had
// released; and the next Open gives its log a new id (and only that one).
func TestWholeDirectoryRestoreFoundByPeerEvidence(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	aAddr, bAddr := DeviceAddress{User: "a", Device: 1}, DeviceAddress{User: "b", Device: 1}
	var a *testNode
	var aLog *noticeLog
	open := func(w *wall) {
		t.Helper()
		n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Name: "a", Wall: w.Now, NoSync: true, SyncInterval: -1, ReconcileInterval: -1,
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("a", aAddr)}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		a = &testNode{Node: n, t: t, wall: w, ctx: ctx}
		aLog = &noticeLog{}
		t.Cleanup(aLog.watch(n))
		net.Register("a", n)
		net.RegisterDevice("a", n)
	}
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1,
		Device: &DeviceConfig{Address: bAddr, Transport: net.DeviceTransport("b", bAddr), Buffer: 16}})
	b.define(defT)
	net.Register("b", b.Node)
	net.RegisterDevice("b", b.Node)
	var bLog noticeLog
	defer bLog.watch(b.Node)()
	w := newWall()
	open(w)
	a.define(defT)
	trustNode(t, a.Node, b.Node)
	trustNode(t, b.Node, a.Node)
	site := a.Identity().Site
	if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(site)); err != nil {
		t.Fatal(err)
	}
	link := func() {
		t.Helper()
		if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
	}
	send := func(body string) {
		t.Helper()
		if _, err := a.Send(ctx, bAddr, []byte(body)); err != nil {
			t.Fatal(err)
		}
		receiveCommit(t, b, body)
		if err := net.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	link()
	a.write(1)
	send("before the copy")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	copyDir(t, dir, backup)
	open(w)
	link()
	for i := 10; i < 15; i++ {
		a.write(i)
	}
	send("after the copy 1")
	send("after the copy 2")
	a.syncNow("b")
	var highest messages.HLC
	for h := range ownHLCs(t, b.Node, site) {
		highest = max(highest, h)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, dir)

	open(newWall()) // the wall clock set back to the backup's time
	if st := a.RestoreStatus(); st.Suspected || st.DeliverySuspected {
		t.Fatalf("setup: the whole-directory copy was told at Open: %+v", st)
	}
	link()
	a.reconcile("b")
	st := a.RestoreStatus()
	if !st.Suspected || !strings.Contains(st.Reason, "peer holds events of this node") {
		t.Fatalf("a reconciliation returned a's own lost events and the restore is not reported: %+v", st)
	}
	if got := labeledCounter(t, a, "syncmesh_restore_detected_total", map[string]string{"plane": "sync", "evidence": "peer"}); got != 1 {
		t.Fatalf("syncmesh_restore_detected_total{sync,peer} = %v, want 1", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		aLog.mu.Lock()
		n := len(aLog.restoreNotices)
		aLog.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d RestoreDetected notices, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 20; i < 23; i++ {
		out, err := a.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i})
		if err != nil {
			t.Fatal(err)
		}
		if out.HLC <= highest {
			t.Fatalf("write %d issued HLC %v, not above the released %v", i, out.HLC, highest)
		}
	}
	before, _ := bLog.counts()
	send("after the restore")
	if undecryptable, repairs := bLog.counts(); undecryptable != before {
		t.Fatalf("b could not decrypt %d envelopes of the restored a (repairs at b: %+v)", undecryptable-before, repairs)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	open(newWall())
	if st := a.RestoreStatus(); !st.Suspected || !st.LogRotated {
		t.Fatalf("the Open after the evidence did not rotate the log: %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	open(newWall())
	if st := a.RestoreStatus(); st.Suspected || st.LogRotated {
		t.Fatalf("the evidence is acted on again at a later Open: %+v", st)
	}
}

// TestOwnEventsBackFromAPeerAreNoEvidenceWhenHeld: a node that gets its
// own events back from a peer while its store holds them (duplicates)
// sees no restore, across a restart too.
func TestOwnEventsBackFromAPeerAreNoEvidenceWhenHeld(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	dir := t.TempDir()
	open := func() *testNode {
		a := openTestNode(t, Config{Name: "a", Dir: dir, NoSync: true, SyncInterval: -1, ReconcileInterval: -1})
		net.Register("a", a.Node)
		return a
	}
	a := open()
	a.define(defT)
	b := openTestNode(t, Config{Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	b.define(defT)
	net.Register("b", b.Node)
	trustNode(t, a.Node, b.Node)
	trustNode(t, b.Node, a.Node)
	link := func() {
		if err := a.AddPeer("b", net.Transport("a"), "", PeerSite(b.Identity().Site)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.AddPeer("a", net.Transport("b"), "", PeerSite(a.Identity().Site)); err != nil {
		t.Fatal(err)
	}
	link()
	for i := 0; i < 5; i++ {
		a.write(i)
	}
	a.syncNow("b")
	a.reconcile("b")
	if _, err := b.SyncNow(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	// Its own events handed back as received (what a relay does): all
	// duplicates.
	log, err := a.Log(ctx, 0, 100)
	if err != nil || len(log) != 5 {
		t.Fatalf("a's log: %d events, %v", len(log), err)
	}
	var raws [][]byte
	for _, e := range log {
		raws = append(raws, e.Raw)
	}
	outs, err := a.ApplySignedBatch(ctx, raws)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if o.Kind != messages.Duplicate {
			t.Fatalf("setup: own event back: %+v", o)
		}
	}
	if st := a.RestoreStatus(); st.Suspected {
		t.Fatalf("own events back from a peer, all held: %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = open()
	link()
	a.reconcile("b")
	if st := a.RestoreStatus(); st.Suspected || st.LogRotated {
		t.Fatalf("after a restart: %+v", st)
	}
}
