package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// flowModel replays the storage side of one pair with a window of
// messages in flight, as the session committers write it: every tick the
// sender commits one batch of new outbound rows and the ACKs of an older
// batch, and the receiver commits one batch of new pending entries and the
// finalization of an older batch, each transaction with the peer's session
// record. The sizes are those of 256-byte messages.
type flowModel struct {
	batch, ackLag, finLag int // messages per transaction; ticks until ACK and commit
	ids                   func(i int) messages.LogicalMessageID
}

// randomIDs are the ids an application draws at random (seeded: the page
// counts are deterministic).
func randomIDs(seed uint64) func(int) messages.LogicalMessageID {
	r := rand.New(rand.NewPCG(seed, 1))
	return func(int) messages.LogicalMessageID {
		var id messages.LogicalMessageID
		binary.BigEndian.PutUint64(id[:8], r.Uint64())
		binary.BigEndian.PutUint64(id[8:], r.Uint64())
		return id
	}
}

// timeOrderedIDs have the layout of the ids the device draws (a 48-bit
// millisecond time, then random bytes), 8 messages a millisecond.
func timeOrderedIDs(seed uint64) func(int) messages.LogicalMessageID {
	r := rand.New(rand.NewPCG(seed, 2))
	return func(i int) messages.LogicalMessageID {
		var id messages.LogicalMessageID
		binary.BigEndian.PutUint64(id[8:], r.Uint64())
		binary.BigEndian.PutUint64(id[:8], uint64(1_700_000_000_000+i/8)<<16|r.Uint64()&0xffff)
		return id
	}
}

type flowWrites struct{ sender, receiver WriteStats }

func (w flowWrites) pagesPerCommit() float64 {
	return float64(w.sender.Pages+w.receiver.Pages) / float64(w.sender.Commits+w.receiver.Commits)
}

func (w flowWrites) bytesPerMessage(n int) float64 {
	return float64(w.sender.Bytes+w.receiver.Bytes) / float64(n)
}

// run replays n messages on fresh files in dir and returns what the timed
// part (after the first ticks) wrote.
func (m flowModel) run(tb testing.TB, dir string, n int, noSync bool) flowWrites {
	tb.Helper()
	s, err := sealed.New(sealed.Key{7, 7, 7})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	snd := mustOpen(tb, filepath.Join(dir, "sender.db"), Options{NoSync: noSync, Sealer: s})
	defer snd.Close()
	rcv := mustOpen(tb, filepath.Join(dir, "receiver.db"), Options{NoSync: noSync, Sealer: s})
	defer rcv.Close()
	alice := messages.DeviceAddress{User: "sender00", Device: 1}
	bob := messages.DeviceAddress{User: "receiver", Device: 1}
	record := make([]byte, 1200)
	body := make([]byte, 256)
	frame := make([]byte, 256+24)
	ids := make([]messages.LogicalMessageID, 0, n)
	id := func(i int) messages.LogicalMessageID {
		for len(ids) <= i {
			ids = append(ids, m.ids(len(ids)))
		}
		return ids[i]
	}
	now := int64(1_700_000_000_000)
	ticks := n/m.batch + max(m.ackLag, m.finLag)
	var w0 flowWrites
	for tick := 0; tick < ticks; tick++ {
		if tick == max(m.ackLag, m.finLag) {
			w0 = flowWrites{snd.DeliveryWrites(), rcv.DeliveryWrites()}
		}
		now++
		batch := func(lag int) (int, int) {
			first := (tick - lag) * m.batch
			if first < 0 || first >= n {
				return 0, 0
			}
			return first, min(first+m.batch, n)
		}
		if err := snd.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
			lo, hi := batch(0)
			for i := lo; i < hi; i++ {
				if _, err := tx.PutPendingOutbound(persistence.PendingOutbound{Recipient: bob, ID: id(i), CreatedAt: now, Attempts: 1, LastAttemptAt: now, Body: body}); err != nil {
					return err
				}
			}
			lo, hi = batch(m.ackLag)
			for i := lo; i < hi; i++ {
				if _, err := tx.DeletePendingOutbound(bob, id(i)); err != nil {
					return err
				}
			}
			return tx.PutSession(bob, record)
		}); err != nil {
			tb.Fatal(err)
		}
		if err := rcv.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
			lo, hi := batch(1)
			for i := lo; i < hi; i++ {
				if _, err := tx.PutPendingInbound(persistence.PendingInbound{Sender: alice, ID: id(i), ReceivedAt: now, Frame: frame, Deliveries: 1}); err != nil {
					return err
				}
			}
			lo, hi = batch(m.finLag)
			for i := lo; i < hi; i++ {
				if _, err := tx.DeletePendingInbound(alice, id(i)); err != nil {
					return err
				}
				d := [32]byte{byte(i), byte(i >> 8)}
				if err := tx.PutProcessedInbound(persistence.ProcessedInbound{Sender: alice, ID: id(i), Finalization: persistence.FinalizationCommitted, FinalizedAt: now, Digest: &d}); err != nil {
					return err
				}
			}
			return tx.PutSession(alice, record)
		}); err != nil {
			tb.Fatal(err)
		}
	}
	w1 := flowWrites{snd.DeliveryWrites(), rcv.DeliveryWrites()}

	return flowWrites{
		sender:   WriteStats{w1.sender.Commits - w0.sender.Commits, w1.sender.Pages - w0.sender.Pages, w1.sender.Bytes - w0.sender.Bytes},
		receiver: WriteStats{w1.receiver.Commits - w0.receiver.Commits, w1.receiver.Pages - w0.receiver.Pages, w1.receiver.Bytes - w0.receiver.Bytes},
	}
}

// DeliveryWrites counts the pages of committed delivery transactions
// only: a failed Update and a sync commit add nothing, a record larger than
// a page adds its overflow pages, and bytes are pages of the file's size.
func TestDeliveryWritesCountsCommittedPages(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	ctx := context.Background()
	page := uint64(db.bolt.Info().PageSize)
	peer := messages.DeviceAddress{User: "alice", Device: 1}
	if got := db.DeliveryWrites(); got != (WriteStats{}) {
		t.Fatalf("after Open: %+v, want zero", got)
	}
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error { return tx.PutSession(peer, []byte{1}) }); err != nil {
		t.Fatal(err)
	}
	small := db.DeliveryWrites()
	// The session bucket's leaf, the root, the freelist and the meta page
	// at least.
	if small.Commits != 1 || small.Pages < 3 || small.Bytes != small.Pages*page {
		t.Fatalf("one small commit: %+v (page %d)", small, page)
	}
	_ = db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := tx.PutSession(peer, make([]byte, 10*page)); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err := db.Sync().Update(ctx, func(tx persistence.SyncTx) error { return tx.PutMeta("k", make([]byte, 3*page)) }); err != nil {
		t.Fatal(err)
	}
	if got := db.DeliveryWrites(); got != small {
		t.Fatalf("after a failed delivery Update and a sync commit: %+v, want %+v", got, small)
	}
	if err := db.Delivery().Update(ctx, func(tx persistence.DeliveryTx) error { return tx.PutSession(peer, make([]byte, 10*page)) }); err != nil {
		t.Fatal(err)
	}
	big := db.DeliveryWrites()
	if big.Commits != 2 || big.Pages-small.Pages < 10+3 || big.Bytes != big.Pages*page {
		t.Fatalf("a 10-page record: %+v after %+v", big, small)
	}
}

// The pages a commit of the 64-in-flight flow writes (the model, 2 000
// messages of 256 B, 16 per transaction): the pending buckets split fuller
// (appendFillPercent), and time-ordered ids (device.NewLogicalMessageID)
// keep each commit's inserts and deletes on a few leaves where random
// ids scatter them over the processed index and the pending buckets.
// Page counts are deterministic: seeded ids, no timing.
func TestDeliveryCommitPages(t *testing.T) {
	const n = 2000
	run := func(fill float64, ids func(int) messages.LogicalMessageID) flowWrites {
		t.Helper()
		old := appendFillPercent
		appendFillPercent = fill
		defer func() { appendFillPercent = old }()
		return flowModel{batch: 16, ackLag: 4, finLag: 2, ids: ids}.run(t, t.TempDir(), n, true)
	}
	show := func(name string, w flowWrites) {
		t.Logf("%-36s sender %5.1f pages/commit, receiver %5.1f, pair %5.1f; %6.0f bytes/message", name,
			float64(w.sender.Pages)/float64(w.sender.Commits), float64(w.receiver.Pages)/float64(w.receiver.Commits),
			w.pagesPerCommit(), w.bytesPerMessage(n))
	}
	baseRandom := run(0.5, randomIDs(1))
	show("random ids, default fill", baseRandom)
	random := run(appendFillPercent, randomIDs(1))
	show("random ids", random)
	ordered := run(appendFillPercent, timeOrderedIDs(1))
	show("time-ordered ids", ordered)
	if s, s0 := random.sender.Pages, baseRandom.sender.Pages; float64(s) > 0.95*float64(s0) {
		t.Errorf("sender pages with fill %.2f: %d, with the default: %d (want at least 5%% fewer)", appendFillPercent, s, s0)
	}
	if o, r := ordered.pagesPerCommit(), random.pagesPerCommit(); o > 0.75*r {
		t.Errorf("time-ordered ids: %.1f pages per commit, random ids %.1f (want at most 0.75 of it)", o, r)
	}
}

// BenchmarkDeliveryFlowCommit times the model's commits with fsync on:
// what the pages a commit writes cost beyond its two fdatasyncs.
func BenchmarkDeliveryFlowCommit(b *testing.B) {
	for _, c := range []struct {
		name string
		ids  func(uint64) func(int) messages.LogicalMessageID
	}{{"random", randomIDs}, {"time-ordered", timeOrderedIDs}} {
		b.Run(c.name, func(b *testing.B) {
			const n = 2000
			var w flowWrites
			for i := 0; i < b.N; i++ {
				m := flowModel{batch: 16, ackLag: 4, finLag: 2, ids: c.ids(uint64(i))}
				w = m.run(b, b.TempDir(), n, false)
			}
			commits := float64(w.sender.Commits + w.receiver.Commits)
			b.ReportMetric(w.pagesPerCommit(), "pages/commit")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/commits/1e3, "µs/commit")
		})
	}
}
