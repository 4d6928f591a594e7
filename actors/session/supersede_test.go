package session

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// countingStore counts the session records its transactions put.
type countingStore struct {
	*gatedStore
	puts int
}

type countingTx struct {
	persistence.DeliveryTx
	s *countingStore
}

func (t countingTx) PutSession(peer messages.DeviceAddress, record []byte) error {
	t.s.puts++
	return t.DeliveryTx.PutSession(peer, record)
}

func (s *countingStore) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	return s.gatedStore.Update(ctx, func(tx persistence.DeliveryTx) error { return fn(countingTx{tx, s}) })
}

// records returns n successive, distinct session records of one session.
func records(t *testing.T, n int) []ratchet.SessionRecord {
	t.Helper()
	alice, err := ratchet.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	bob, err := ratchet.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := ratchet.NewPrekeyStore(bob, time.Now(), ratchet.DefaultPrekeyConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, bundle, err := ps.IssueBundle(bob.Public())
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := ratchet.Initiate(ratchet.SessionRecord{}, alice, &bundle, ratchet.Route{From: messages.DeviceAddress{User: "alice", Device: 1}, To: messages.DeviceAddress{User: "bob", Device: 1}})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]ratchet.SessionRecord, n)
	for i := range out {
		if rec, _, err = ratchet.Encrypt(rec, []byte("x")); err != nil {
			t.Fatal(err)
		}
		out[i] = rec
	}
	return out
}

func sessionItem(peer int, ch *chain, rec ratchet.SessionRecord, fail error, res chan<- error) *item {
	wr := &writes{peer: peerN(peer)}
	wr.setSession(ratchet.SessionRecord{}, rec)
	return &item{chain: ch, writes: wr, apply: func(tx persistence.DeliveryTx, st *Stats) error {
		if err := wr.run(tx, st); err != nil {
			return err
		}
		return fail
	}, done: func(err error) { res <- err }}
}

func storedRecord(t *testing.T, st persistence.DeliveryStore, peer int) []byte {
	t.Helper()
	var raw []byte
	if err := st.View(context.Background(), func(r persistence.DeliveryReader) error {
		var err error
		raw, _, err = r.Session(peerN(peer))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return raw
}

func mustMarshal(t *testing.T, rec ratchet.SessionRecord) []byte {
	t.Helper()
	raw, err := ratchet.MarshalState(rec)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// Consecutive ratchet steps of one peer in one transaction put its
// session record once, the last one; another peer's record is put too.
// When the item holding the last step fails, the retry without it puts
// the step before it (the one now last): what is stored is always the
// newest step among the items that committed.
func TestCommitterPutsOneSessionRecordPerPeerAndTransaction(t *testing.T) {
	recs := records(t, 4)
	cs := &countingStore{gatedStore: &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}}
	sys, pid := startCommitter(t, cs)
	res := make([]chan error, 5)
	for i := range res {
		res[i] = make(chan error, 1)
	}
	sys.Root.Send(pid, putItem(9, nil, nil, res[0])) // held: the rest queue behind it
	<-cs.entered
	ch := &chain{}
	sys.Root.Send(pid, sessionItem(1, ch, recs[0], nil, res[1]))
	sys.Root.Send(pid, sessionItem(1, ch, recs[1], nil, res[2]))
	sys.Root.Send(pid, sessionItem(2, &chain{}, recs[3], nil, res[3]))
	sys.Root.Send(pid, sessionItem(1, ch, recs[2], nil, res[4]))
	close(cs.gate)
	for i := range res {
		if err := <-res[i]; err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if u := cs.updates.Load(); u != 2 {
		t.Fatalf("%d transactions, want 2", u)
	}
	if cs.puts != 1+2 { // the held marker, then peer 1 once and peer 2 once
		t.Fatalf("%d session puts, want 3", cs.puts)
	}
	if got := storedRecord(t, cs, 1); !bytes.Equal(got, mustMarshal(t, recs[2])) {
		t.Fatal("peer 1: the stored record is not its last step")
	}
	if got := storedRecord(t, cs, 2); !bytes.Equal(got, mustMarshal(t, recs[3])) {
		t.Fatal("peer 2: the stored record is not its step")
	}

	// The last step fails: the retry stores the one before it.
	cs2 := &countingStore{gatedStore: &gatedStore{DeliveryStore: memory.NewDelivery(), gate: make(chan struct{}), entered: make(chan struct{})}}
	sys, pid = startCommitter(t, cs2)
	boom := errors.New("boom")
	sys.Root.Send(pid, putItem(9, nil, nil, res[0]))
	<-cs2.entered
	ch = &chain{}
	sys.Root.Send(pid, sessionItem(1, ch, recs[0], nil, res[1]))
	sys.Root.Send(pid, sessionItem(1, ch, recs[1], nil, res[2]))
	sys.Root.Send(pid, sessionItem(1, ch, recs[2], boom, res[3]))
	close(cs2.gate)
	errs := []error{<-res[0], <-res[1], <-res[2], <-res[3]}
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || !errors.Is(errs[3], boom) {
		t.Fatalf("errors %v", errs)
	}
	if got := storedRecord(t, cs2, 1); !bytes.Equal(got, mustMarshal(t, recs[1])) {
		t.Fatal("after the last step failed, the stored record is not the step before it")
	}
}
