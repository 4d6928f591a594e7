package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	bbolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func genInt64(t *rapid.T, label string) int64 {
	switch rapid.IntRange(0, 4).Draw(t, label+"-kind") {
	case 0:
		return 0
	case 1:
		return math.MinInt64
	case 2:
		return math.MaxInt64
	}
	return rapid.Int64().Draw(t, label)
}

// The hand-written encoders of the commit-boundary records write exactly
// what the codec's reflective Marshal writes, and the hand readers read
// them back as the strict decoders do.
func TestInboundRecordEncodersMatchCodec(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		version := rapid.SampledFrom([]uint64{recordVersion, recordVersion, recordVersion, 0, 1 << 40})
		pin := pendingInRecord{V: version.Draw(t, "pv"), Seq: rapid.Uint64().Draw(t, "pseq"), ReceivedAt: genInt64(t, "at"),
			Frame: rapid.SliceOf(rapid.Byte()).Draw(t, "frame")}
		if rapid.Bool().Draw(t, "deliveries") {
			d := rapid.Uint32().Draw(t, "d")
			pin.Deliveries = &d
		}
		want, err := messages.Marshal(&pin)
		if err != nil {
			t.Fatal(err)
		}
		got := encodePendingIn(&pin)
		if !bytes.Equal(got, want) {
			t.Fatalf("pending:\n got %x\nwant %x", got, want)
		}
		ref, rerr := decodePendingIn(got)
		if fast, err := readPendingInRecord(got); (err != nil) != (rerr != nil) || (err == nil && !reflect.DeepEqual(fast, ref)) {
			t.Fatalf("pending read (%+v, %v), decoded (%+v, %v)", fast, err, ref, rerr)
		}

		out := outboundRecord{V: version.Draw(t, "ov"), Seq: rapid.Uint64().Draw(t, "oseq"), CreatedAt: genInt64(t, "created"),
			Attempts: rapid.Uint32().Draw(t, "attempts"), LastAttemptAt: genInt64(t, "last"), Body: rapid.SliceOf(rapid.Byte()).Draw(t, "body")}
		if want, err = messages.Marshal(&out); err != nil {
			t.Fatal(err)
		}
		if got = encodeOutbound(&out); !bytes.Equal(got, want) {
			t.Fatalf("outbound:\n got %x\nwant %x", got, want)
		}
		oref, rerr := decodeOutbound(got)
		if fast, err := readOutboundRecord(got); (err != nil) != (rerr != nil) || (err == nil && !reflect.DeepEqual(fast, oref)) {
			t.Fatalf("outbound read (%+v, %v), decoded (%+v, %v)", fast, err, oref, rerr)
		}

		e := processedEntry{Kind: rapid.Uint8().Draw(t, "kind"), FinalizedAt: genInt64(t, "fin"), Reason: rapid.Uint8().Draw(t, "reason"),
			Legacy: rapid.Bool().Draw(t, "legacy")}
		if rapid.Bool().Draw(t, "digest") {
			e.Digest = rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "dg")
		}
		if want, err = messages.Marshal(&e); err != nil {
			t.Fatal(err)
		}
		if got = encodeProcessedEntry(&e); !bytes.Equal(got, want) {
			t.Fatalf("processed entry %+v:\n got %x\nwant %x", e, got, want)
		}

		pr := processedRecord{V: rapid.SampledFrom([]uint64{processedRecordVersion, processedRecordVersion, 1, 9}).Draw(t, "prv"), Entry: rapid.SliceOf(rapid.Byte()).Draw(t, "entry")}
		if want, err = messages.Marshal(&pr); err != nil {
			t.Fatal(err)
		}
		if got = encodeProcessedRecord(&pr); !bytes.Equal(got, want) {
			t.Fatalf("processed:\n got %x\nwant %x", got, want)
		}
		pref, rerr := decodeProcessed(got)
		if fast, err := readProcessedRecord(got); (err != nil) != (rerr != nil) || (err == nil && !reflect.DeepEqual(fast, pref)) {
			t.Fatalf("processed read (%+v, %v), decoded (%+v, %v)", fast, err, pref, rerr)
		}
	})
}

// FuzzInboundRecordReaders holds the hand readers to the strict decoders:
// what a fast path accepts the decoder reads the same and the encoder
// writes back byte for byte; the readers' verdict is always the
// decoders', so a damaged record stays ErrCorrupt.
func FuzzInboundRecordReaders(f *testing.F) {
	d := uint32(2)
	f.Add(encodePendingIn(&pendingInRecord{V: recordVersion, Seq: 3, ReceivedAt: 1_700_000_000_000, Frame: make([]byte, 300), Deliveries: &d}))
	f.Add(encodePendingIn(&pendingInRecord{V: recordVersion, Seq: 1, ReceivedAt: -5, Frame: []byte{}}))
	f.Add(encodeOutbound(&outboundRecord{V: recordVersion, Seq: 9, CreatedAt: 1_700_000_000_000, Attempts: 1, LastAttemptAt: 1_700_000_000_000, Body: make([]byte, 280)}))
	f.Add(encodeProcessedRecord(&processedRecord{V: processedRecordVersion, Entry: make([]byte, 90)}))
	f.Add([]byte{0xa2, 0x01, 0x02, 0x02, 0xf6})
	f.Fuzz(func(t *testing.T, data []byte) {
		pref, perr := decodePendingIn(data)
		if fast, ok := readCanonicalPendingIn(data); ok {
			if perr != nil || !reflect.DeepEqual(fast, pref) {
				t.Fatalf("pending: hand reader accepted what the codec reads differently: %+v, %+v (%v)", fast, pref, perr)
			}
			if again := encodePendingIn(&fast); !bytes.Equal(again, data) {
				t.Fatalf("pending: hand reader accepted a non-canonical record %x (canonical %x)", data, again)
			}
		}
		if got, err := readPendingInRecord(data); (err != nil) != (perr != nil) || (err == nil && !reflect.DeepEqual(got, pref)) {
			t.Fatalf("pending: read (%+v, %v), decoded (%+v, %v)", got, err, pref, perr)
		}

		oref, oerr := decodeOutbound(data)
		if fast, ok := readCanonicalOutbound(data); ok {
			if oerr != nil || !reflect.DeepEqual(fast, oref) {
				t.Fatalf("outbound: hand reader accepted what the codec reads differently: %+v, %+v (%v)", fast, oref, oerr)
			}
			if again := encodeOutbound(&fast); !bytes.Equal(again, data) {
				t.Fatalf("outbound: hand reader accepted a non-canonical record %x (canonical %x)", data, again)
			}
		}
		if got, err := readOutboundRecord(data); (err != nil) != (oerr != nil) || (err == nil && !reflect.DeepEqual(got, oref)) {
			t.Fatalf("outbound: read (%+v, %v), decoded (%+v, %v)", got, err, oref, oerr)
		}

		rref, rerr := decodeProcessed(data)
		if fast, ok := readCanonicalProcessed(data); ok {
			if rerr != nil || !reflect.DeepEqual(fast, rref) {
				t.Fatalf("processed: hand reader accepted what the codec reads differently: %+v, %+v (%v)", fast, rref, rerr)
			}
			if again := encodeProcessedRecord(&fast); !bytes.Equal(again, data) {
				t.Fatalf("processed: hand reader accepted a non-canonical record %x (canonical %x)", data, again)
			}
		}
		if got, err := readProcessedRecord(data); (err != nil) != (rerr != nil) || (err == nil && !reflect.DeepEqual(got, rref)) {
			t.Fatalf("processed: read (%+v, %v), decoded (%+v, %v)", got, err, rref, rerr)
		}
	})
}

// The commit-boundary counters move in the transaction's memory and are
// written once before the commit: rows of the transaction see the moved
// values, the bucket holds the old ones until the commit, and a failed
// transaction leaves them as they were.
func TestCountersAreWrittenOnceBeforeTheCommit(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	ctx := context.Background()
	alice := messages.DeviceAddress{User: "alice", Device: 1}
	stored := func(tx *bbolt.Tx, name []byte) uint64 {
		v := tx.Bucket(bucketInMeta).Get(name)
		if v == nil {
			return 0
		}
		return binary.BigEndian.Uint64(v)
	}
	put := func(tx persistence.DeliveryTx, b byte) error {
		_, err := tx.PutPendingInbound(persistence.PendingInbound{Sender: alice, ID: messages.LogicalMessageID{b}, ReceivedAt: 1, Frame: []byte{b}, Deliveries: 1})
		return err
	}
	if err := db.Delivery().Update(ctx, func(ptx persistence.DeliveryTx) error {
		for b := byte(1); b <= 3; b++ {
			if err := put(ptx, b); err != nil {
				return err
			}
		}
		if n, err := ptx.PendingInboundCount(nil); err != nil || n != 3 {
			return fmt.Errorf("count inside the transaction: %d, %v", n, err)
		}
		if _, err := ptx.DeletePendingInbound(alice, messages.LogicalMessageID{2}); err != nil {
			return err
		}
		btx := ptx.(*deliveryTx).tx
		if c, s := stored(btx.Tx, inMetaPendingCount), stored(btx.Tx, inMetaPendingSeq); c != 0 || s != 0 {
			return fmt.Errorf("stored before the commit: count %d, sequence %d", c, s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check := func(when string, count, seq uint64) {
		t.Helper()
		if err := db.bolt.View(func(tx *bbolt.Tx) error {
			if c, s := stored(tx, inMetaPendingCount), stored(tx, inMetaPendingSeq); c != count || s != seq {
				return fmt.Errorf("%s: stored count %d, sequence %d; want %d, %d", when, c, s, count, seq)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	check("after the commit", 2, 3)
	_ = db.Delivery().Update(ctx, func(ptx persistence.DeliveryTx) error {
		if err := put(ptx, 4); err != nil {
			return err
		}
		return errors.New("abort")
	})
	check("after a failed transaction", 2, 3)
	var seq uint64
	if err := db.Delivery().Update(ctx, func(ptx persistence.DeliveryTx) (err error) {
		seq, err = ptx.PutPendingInbound(persistence.PendingInbound{Sender: alice, ID: messages.LogicalMessageID{4}, ReceivedAt: 1, Frame: []byte{4}, Deliveries: 1})
		return err
	}); err != nil || seq != 4 {
		t.Fatalf("next sequence %d (%v), want 4: sequences are never reused", seq, err)
	}
	check("after the next commit", 3, 4)
}

// The transaction's reused cursor reads what bbolt's Get reads, between
// and after any writes of the same transaction.
func TestCursorGetAgreesWithGetAcrossWrites(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	rapid.Check(t, func(rt *rapid.T) {
		if err := db.Delivery().Update(context.Background(), func(ptx persistence.DeliveryTx) error {
			tx := ptx.(*deliveryTx)
			b, err := tx.bucket(bucketInPendingSeq)
			if err != nil {
				return err
			}
			for i, n := 0, rapid.IntRange(1, 300).Draw(rt, "ops"); i < n; i++ {
				k := u64(uint64(rapid.IntRange(0, 400).Draw(rt, "key")))
				switch rapid.IntRange(0, 2).Draw(rt, "op") {
				case 0:
					if err := b.Put(k, bytes.Repeat([]byte{byte(i)}, rapid.IntRange(0, 200).Draw(rt, "len"))); err != nil {
						return err
					}
				case 1:
					if err := b.Delete(k); err != nil {
						return err
					}
				}
				if got, want := tx.get(b, k), b.Get(k); !bytes.Equal(got, want) || (got == nil) != (want == nil) {
					rt.Fatalf("key %x: get %x, Get %x", k, got, want)
				}
			}
			return nil
		}); err != nil {
			rt.Fatal(err)
		}
	})
}

// The keys and identities built in one allocation are the ones the
// general builders make (the stored format does not change).
func TestCommitBoundaryKeysMatchTheirBuilders(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		peer := messages.DeviceAddress{User: rapid.StringMatching("(?s).{1,80}").Draw(rt, "user"), Device: rapid.Uint32().Draw(rt, "device")}
		if rapid.Bool().Draw(rt, "nul") {
			peer.User += "\x00" + peer.User
		}
		var id messages.LogicalMessageID
		copy(id[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(rt, "id"))
		want := sealed.MessageIdentity([]byte(peer.User), binary.BigEndian.AppendUint32(nil, peer.Device), id[:])
		if got := msgIdentity(peer, id); !bytes.Equal(got, want) {
			rt.Fatalf("msgIdentity %x, sealed.MessageIdentity %x", got, want)
		}
		ak := addrKey(peer)
		if len(ak) != addrKeyLen(peer) {
			rt.Fatalf("addrKey of %d bytes, addrKeyLen %d", len(ak), addrKeyLen(peer))
		}
		if got := msgKey(peer, id); !bytes.Equal(got, append(bytes.Clone(ak), id[:]...)) {
			rt.Fatalf("msgKey %x", got)
		}
		seq := rapid.Uint64().Draw(rt, "seq")
		if got := senderSeqKey(&senderKeyBuf{}, ak, seq); !bytes.Equal(got, append(bytes.Clone(ak), u64(seq)...)) {
			rt.Fatalf("senderSeqKey %x", got)
		}
		var b [8]byte
		if got := seqKey(&b, seq); !bytes.Equal(got, u64(seq)) {
			rt.Fatalf("seqKey %x", got)
		}
	})
}

// scanFew visits what scan visits, in the same order, wherever fn stops,
// also when fn writes to the bucket it scans.
func TestScanFewVisitsWhatScanVisits(t *testing.T) {
	db := mustOpen(t, filepath.Join(t.TempDir(), "n.db"), Options{NoSync: true})
	defer db.Close()
	rapid.Check(t, func(rt *rapid.T) {
		err := db.bolt.Update(func(btx *bbolt.Tx) error {
			tx := wrapTx(btx)
			b, err := tx.CreateBucket([]byte("scan"))
			if err != nil {
				return err
			}
			defer func() { _ = tx.DeleteBucket([]byte("scan")) }()
			for _, k := range rapid.SliceOf(rapid.SliceOfN(rapid.ByteRange(0, 3), 1, 4)).Draw(rt, "keys") {
				if err := b.Put(k, bytes.Repeat(k, 3)); err != nil {
					return err
				}
			}
			start := rapid.SliceOfN(rapid.ByteRange(0, 3), 0, 3).Draw(rt, "start")
			prefix := rapid.SliceOfN(rapid.ByteRange(0, 3), 0, 1).Draw(rt, "prefix")
			stop := rapid.IntRange(0, 600).Draw(rt, "stop")
			write := rapid.Bool().Draw(rt, "write")
			visit := func(scanner func(*wbucket, []byte, []byte, func(k, v []byte) (bool, error)) error) []string {
				var seen []string
				if err := scanner(b, start, prefix, func(k, v []byte) (bool, error) {
					seen = append(seen, string(k)+"="+string(v))
					if write {
						// Rewrite the value just seen (same key set).
						if err := b.Put(k, append(bytes.Clone(v[:len(k)*3]), 0)); err != nil {
							return false, err
						}
						if err := b.Put(k, v[:len(k)*3]); err != nil {
							return false, err
						}
					}
					return len(seen) < stop, nil
				}); err != nil {
					rt.Fatal(err)
				}
				return seen
			}
			if got, want := visit(scanFew), visit(scan); !reflect.DeepEqual(got, want) {
				rt.Fatalf("scanFew %q, scan %q", got, want)
			}
			return nil
		})
		if err != nil {
			rt.Fatal(err)
		}
	})
}
