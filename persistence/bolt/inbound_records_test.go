package bolt

import (
	"bytes"
	"math"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
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
