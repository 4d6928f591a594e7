package replicate

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// fakeTx is a distinct write transaction for the in-memory view; the view
// only compares identities.
type fakeTx struct {
	persistence.SyncTx
	n int
}

// TestTxViewIsOneTransactionAndDroppedByTheNext: the ranges a push left in
// a transaction not yet committed are seen by later pushes of that
// transaction only; a transaction nobody ended (its caller gone before
// the commit) is forgotten when the next one records, so abandoned views
// cannot accumulate.
func TestTxViewIsOneTransactionAndDroppedByTheNext(t *testing.T) {
	var m progressMemory
	m.recordedPush(&messages.SyncPush{From: "a"}, recorded{ranges: []pendingRange{{after: 1, through: 2}}})
	tx1, tx2 := &fakeTx{n: 1}, &fakeTx{n: 2}
	m.setTxRanges(tx1, "a", []pendingRange{{after: 5, through: 9}})
	if got := m.txRanges(tx1, "a"); len(got) != 1 || got[0].through != 9 {
		t.Fatalf("tx1 view = %+v, want the range tx1 recorded", got)
	}
	if got := m.txRanges(tx2, "a"); len(got) != 1 || got[0].through != 2 {
		t.Fatalf("tx2 sees %+v, want the committed ranges", got)
	}
	// tx1 is never ended; tx2 records: tx1's view is gone.
	m.setTxRanges(tx2, "b", nil)
	if m.tx != persistence.SyncTx(tx2) || len(m.txView) != 1 {
		t.Fatalf("view holds %v entries for %v, want only tx2's", len(m.txView), m.tx)
	}
	if got := m.txRanges(tx1, "a"); len(got) != 1 || got[0].through != 2 {
		t.Fatalf("abandoned tx1 view still read: %+v", got)
	}
	m.endTx(tx2)
	if m.tx != nil || m.txView != nil {
		t.Fatal("endTx left the view")
	}
}
