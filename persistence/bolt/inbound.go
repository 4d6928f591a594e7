package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Commit-boundary buckets (docs/protocol.md, commit boundary, "Storage"), added by
// layout 4. Names are part of the storage format. msgKey = addrKey(peer) |
// logical id(16); seq = u64be; ts = u64be(Unix ms XOR 1<<63), so signed
// times sort as bytes.
var (
	bucketInPending       = []byte("delivery.in_pending")        // msgKey → pendingInRecord (Frame sealed)
	bucketInPendingSeq    = []byte("delivery.in_pending_seq")    // seq → msgKey
	bucketInPendingSender = []byte("delivery.in_pending_sender") // addrKey|seq → id(16)
	bucketInProcessed     = []byte("delivery.in_processed")      // msgKey → processedRecord (layout 11: whole entry sealed)
	bucketInProcessedTime = []byte("delivery.in_processed_time") // ts|msgKey → ∅ (prune index)
	bucketOutPending      = []byte("delivery.out_pending")       // msgKey → outboundRecord (Body sealed)
	bucketOutPendingSeq   = []byte("delivery.out_pending_seq")   // seq → msgKey
	bucketInMeta          = []byte("delivery.in_meta")           // counter name → u64be
)

// Keys of bucketInMeta. The *_seq counters are the highest sequence ever
// assigned: never reused, even after deletions.
var (
	inMetaPendingSeq     = []byte("in_pending_seq")
	inMetaPendingCount   = []byte("in_pending_count")
	inMetaProcessedCount = []byte("in_processed_count")
	inMetaOutSeq         = []byte("out_pending_seq")
	inMetaOutCount       = []byte("out_pending_count")
	// inMetaSessionWrites counts session record writes (SessionWrites).
	// A key added to an existing bucket: absent reads as 0, and builds
	// that do not know it leave it alone.
	inMetaSessionWrites = []byte("session_writes")
)

// inboundBuckets lists the layout-4 buckets.
func inboundBuckets() [][]byte {
	return [][]byte{bucketInPending, bucketInPendingSeq, bucketInPendingSender, bucketInProcessed,
		bucketInProcessedTime, bucketOutPending, bucketOutPendingSeq, bucketInMeta}
}

// createInboundV1 creates the commit-boundary buckets (layout 3 → 4).
func createInboundV1(tx *wtx) error {
	for _, name := range inboundBuckets() {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// Stored records (CBOR, integer keys, version 1).
type pendingInRecord struct {
	V          uint64 `cbor:"1,keyasint"`
	Seq        uint64 `cbor:"2,keyasint"`
	ReceivedAt int64  `cbor:"3,keyasint"`
	Frame      []byte `cbor:"4,keyasint"` // sealed RecordPendingFrame
	// Deliveries is the persisted hand-off count. A
	// record written before it existed lacks the key and reads as 1, so
	// the field extends version 1 without a layout change.
	Deliveries *uint32 `cbor:"5,keyasint,omitempty"`
}

// deliveries is the hand-off count of r (1 for a record without one).
func (r *pendingInRecord) deliveries() uint32 {
	if r.Deliveries == nil {
		return 1
	}
	return *r.Deliveries
}

// processedRecord is a processed entry from layout 11 on: everything but
// the row's key is one sealed RecordProcessedEntry, so the finalization,
// its time, the digest, the discard reason and the legacy marker cannot be
// changed or removed without the storage key. The time
// is also in the plaintext prune index (bucketInProcessedTime).
type processedRecord struct {
	V     uint64 `cbor:"1,keyasint"` // processedRecordVersion
	Entry []byte `cbor:"2,keyasint"` // sealed RecordProcessedEntry: processedEntry
}

// processedRecordVersion is the version of processedRecord (version 1 was
// processedRecordV1, layouts 4–10).
const processedRecordVersion = 2

// processedEntry is the sealed plaintext of a processedRecord.
type processedEntry struct {
	Kind        uint8  `cbor:"1,keyasint"`
	FinalizedAt int64  `cbor:"2,keyasint"`
	Digest      []byte `cbor:"3,keyasint,omitempty"` // ApplicationMessageDigest v1, 32 bytes; absent only with Legacy
	Reason      uint8  `cbor:"4,keyasint,omitempty"`
	Legacy      bool   `cbor:"5,keyasint,omitempty"` // written only by ImportLegacyProcessed
}

// processedRecordV1 is a processed entry of layouts 4–10: kind, time and
// reason in plaintext, only the digest sealed (RecordProcessedDigest), and
// "no digest" meant legacy. Only the layout-11 migration reads it.
type processedRecordV1 struct {
	V           uint64 `cbor:"1,keyasint"`
	Kind        uint8  `cbor:"2,keyasint"`
	FinalizedAt int64  `cbor:"3,keyasint"`
	Digest      []byte `cbor:"4,keyasint,omitempty"` // sealed RecordProcessedDigest
	Reason      uint8  `cbor:"5,keyasint,omitempty"`
}

type outboundRecord struct {
	V             uint64 `cbor:"1,keyasint"`
	Seq           uint64 `cbor:"2,keyasint"`
	CreatedAt     int64  `cbor:"3,keyasint"`
	Attempts      uint32 `cbor:"4,keyasint"`
	LastAttemptAt int64  `cbor:"5,keyasint"`
	Body          []byte `cbor:"6,keyasint"` // sealed RecordOutboundBody
}

func decodePendingIn(b []byte) (pendingInRecord, error) {
	var r pendingInRecord
	if err := decodeRecord("pending inbound", b, &r, &r.V); err != nil {
		return r, err
	}
	if r.Seq == 0 || r.Frame == nil {
		return r, corrupt("pending inbound", fmt.Errorf("missing sequence or frame"))
	}
	return r, nil
}

func decodeProcessed(b []byte) (processedRecord, error) {
	var r processedRecord
	if err := decodeRecordVersion("processed inbound", b, &r, &r.V, processedRecordVersion); err != nil {
		return r, err
	}
	if r.Entry == nil {
		return r, corrupt("processed inbound", fmt.Errorf("no sealed entry"))
	}
	return r, nil
}

// decodeProcessedV1 decodes a layout-4–10 processed record (migration only).
func decodeProcessedV1(b []byte) (processedRecordV1, error) {
	var r processedRecordV1
	if err := decodeRecord("processed inbound (layout 10)", b, &r, &r.V); err != nil {
		return r, err
	}
	f := persistence.Finalization(r.Kind)
	if !f.Valid() || (f == persistence.FinalizationDiscarded && !persistence.DiscardReason(r.Reason).Valid()) ||
		(f == persistence.FinalizationCommitted && r.Reason != 0) {
		return r, corrupt("processed inbound (layout 10)", fmt.Errorf("finalization %d reason %d", r.Kind, r.Reason))
	}
	return r, nil
}

// entryOf is the sealed plaintext of p.
func entryOf(p persistence.ProcessedInbound) processedEntry {
	e := processedEntry{Kind: uint8(p.Finalization), FinalizedAt: p.FinalizedAt, Reason: uint8(p.Reason), Legacy: p.Legacy}
	if p.Digest != nil {
		e.Digest = bytes.Clone(p.Digest[:])
	}
	return e
}

// processedOf decodes an opened processedEntry of (sender, id) and checks
// it as a stored entry (persistence.CheckStoredProcessed): an entry without
// digest and without the legacy marker is corrupt.
func processedOf(sender messages.DeviceAddress, id messages.LogicalMessageID, pt []byte) (persistence.ProcessedInbound, error) {
	what := "processed entry " + sender.String()
	var e processedEntry
	if err := messages.Unmarshal(what, pt, &e, maxRecordSize); err != nil {
		return persistence.ProcessedInbound{}, corrupt(what, err)
	}
	p := persistence.ProcessedInbound{Sender: sender, ID: id, Finalization: persistence.Finalization(e.Kind),
		FinalizedAt: e.FinalizedAt, Reason: persistence.DiscardReason(e.Reason), Legacy: e.Legacy}
	if e.Digest != nil {
		if len(e.Digest) != 32 {
			return p, corrupt(what, fmt.Errorf("digest of %d bytes", len(e.Digest)))
		}
		var d [32]byte
		copy(d[:], e.Digest)
		p.Digest = &d
	}
	if err := persistence.CheckStoredProcessed(p); err != nil {
		return p, corrupt(what, err)
	}
	return p, nil
}

func decodeOutbound(b []byte) (outboundRecord, error) {
	var r outboundRecord
	if err := decodeRecord("pending outbound", b, &r, &r.V); err != nil {
		return r, err
	}
	if r.Seq == 0 || r.Body == nil {
		return r, corrupt("pending outbound", fmt.Errorf("missing sequence or body"))
	}
	return r, nil
}

// msgKey is addrKey(peer) | id.
func msgKey(peer messages.DeviceAddress, id messages.LogicalMessageID) []byte {
	return append(appendAddrKey(make([]byte, 0, addrKeyLen(peer)+len(id)), peer), id[:]...)
}

// parseMsgKey reverses msgKey.
func parseMsgKey(k []byte) (messages.DeviceAddress, messages.LogicalMessageID, error) {
	var id messages.LogicalMessageID
	if len(k) < len(id) {
		return messages.DeviceAddress{}, id, fmt.Errorf("message key of %d bytes: %w", len(k), persistence.ErrCorrupt)
	}
	a, err := parseAddrKey(k[:len(k)-len(id)])
	if err != nil {
		return a, id, err
	}
	copy(id[:], k[len(k)-len(id):])
	return a, id, nil
}

// msgIdentity is the sealed row identity of a commit-boundary record:
// sealed.MessageIdentity(user, u32be device, id).
func msgIdentity(peer messages.DeviceAddress, id messages.LogicalMessageID) []byte {
	// sealed.Identity's encoding (each part after its u32be length), in
	// one allocation: TestMsgIdentityIsSealedMessageIdentity.
	b := make([]byte, 0, 12+len(peer.User)+4+len(id))
	b = binary.BigEndian.AppendUint32(b, uint32(len(peer.User)))
	b = append(b, peer.User...)
	b = binary.BigEndian.AppendUint32(b, 4)
	b = binary.BigEndian.AppendUint32(b, peer.Device)
	b = binary.BigEndian.AppendUint32(b, uint32(len(id)))
	return append(b, id[:]...)
}

// senderKeyBuf holds a sender index key of a typical address on the stack.
type senderKeyBuf [64]byte

// senderSeqKey is addrKey | u64(seq) (bucketInPendingSender) in buf when
// it fits, for keys bbolt only reads or copies.
func senderSeqKey(buf *senderKeyBuf, ak []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(buf[:0], ak...), seq)
}

// seqKey is u64(seq) in a caller's buffer, for keys bbolt only reads or
// copies (Get, Delete, Put's key).
func seqKey(buf *[8]byte, seq uint64) []byte {
	binary.BigEndian.PutUint64(buf[:], seq)
	return buf[:]
}

// tsKey encodes a signed Unix-ms time so that byte order is time order.
func tsKey(ms int64) []byte { return u64(uint64(ms) ^ (1 << 63)) }

func (t *deliveryTx) bucket(name []byte) (*wbucket, error) {
	for i := range t.opened {
		o := &t.opened[i]
		if o.b == nil {
			break
		}
		if bytes.Equal(o.name, name) {
			return o.b, nil
		}
	}
	b := t.tx.Bucket(name)
	if b == nil {
		return nil, fmt.Errorf("bolt: bucket %s missing: %w", name, persistence.ErrCorrupt)
	}
	if t.tx.Writable() && appendOrdered(name) {
		b.SetFillPercent(appendFillPercent)
	}
	for i := range t.opened {
		if t.opened[i].b == nil {
			t.opened[i] = openedBucket{name: name, b: b}
			break
		}
	}
	return b, nil
}

// appendFillPercent is how full bbolt leaves a page it splits in the
// buckets whose keys grow (appendOrdered): bbolt's default of one half
// suits random inserts, but under appends it leaves every page half
// empty, so the index takes twice the pages and a commit rewrites more of
// them. The setting lives in the transaction's bucket handle only; it
// changes nothing stored but where later pages split. (A variable only
// so that a test can compare it with the default.)
var appendFillPercent = 0.9

// appendOrdered reports the delivery buckets whose new keys come after
// the existing ones: sequences, and times (the processed prune index).
func appendOrdered(name []byte) bool {
	for _, b := range [][]byte{bucketInPendingSeq, bucketInPendingSender, bucketInProcessedTime, bucketOutPendingSeq, bucketInPending, bucketOutPending} {
		if bytes.Equal(name, b) {
			return true
		}
	}
	return false
}

// cachedCounter is one counter of bucketInMeta as this transaction sees
// it: read from the bucket once, then moved in memory, and written once
// before the commit (flushCounters) if it changed. Every message moves
// two to four counters (a sequence, a count); a Get and a Put of each per
// row was a tree search and a node insert each time.
type cachedCounter struct {
	name  []byte
	v     uint64
	dirty bool
}

// counter reads a u64 counter of bucketInMeta (0 when absent), with this
// transaction's changes.
func (t *deliveryTx) counter(name []byte) (uint64, error) {
	c, err := t.cachedCounter(name)
	if err != nil {
		return 0, err
	}
	return c.v, nil
}

func (t *deliveryTx) cachedCounter(name []byte) (*cachedCounter, error) {
	for i := range t.counters {
		if bytes.Equal(t.counters[i].name, name) {
			return &t.counters[i], nil
		}
	}
	m, err := t.bucket(bucketInMeta)
	if err != nil {
		return nil, err
	}
	c := cachedCounter{name: name}
	if v := t.get(m, name); v != nil {
		if len(v) != 8 {
			return nil, corrupt("counter "+string(name), fmt.Errorf("%d bytes", len(v)))
		}
		c.v = binary.BigEndian.Uint64(v)
	}
	t.counters = append(t.counters, c)
	return &t.counters[len(t.counters)-1], nil
}

// addCounter adds delta to a counter and returns the new value; the
// stored value changes in flushCounters.
func (t *deliveryTx) addCounter(name []byte, delta int64) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	c, err := t.cachedCounter(name)
	if err != nil {
		return 0, err
	}
	if delta < 0 && uint64(-delta) > c.v {
		return 0, corrupt("counter "+string(name), fmt.Errorf("underflow"))
	}
	if delta != 0 {
		c.v = uint64(int64(c.v) + delta)
		c.dirty = true
	}
	return c.v, nil
}

// flushCounters writes the counters this transaction changed (Update,
// after everything else that moves them).
func (t *deliveryTx) flushCounters() error {
	m, err := t.bucket(bucketInMeta)
	if err != nil {
		return err
	}
	for i := range t.counters {
		c := &t.counters[i]
		if !c.dirty {
			continue
		}
		if err := m.Put(c.name, u64(c.v)); err != nil {
			return err
		}
		c.dirty = false
	}
	return nil
}

func (t *deliveryTx) readPendingIn(k []byte, peer messages.DeviceAddress, id messages.LogicalMessageID, v []byte) (persistence.PendingInbound, error) {
	r, err := readPendingInRecord(v)
	if err != nil {
		return persistence.PendingInbound{}, err
	}
	frame, err := t.openOf("pending frame", peer, persistence.RecordPendingFrame, msgIdentity(peer, id), r.Frame)
	if err != nil {
		return persistence.PendingInbound{}, err
	}
	// open returned a copy: the entry never aliases bbolt memory.
	return persistence.PendingInbound{Sender: peer, ID: id, Sequence: r.Seq, ReceivedAt: r.ReceivedAt, Frame: frame,
		Deliveries: r.deliveries()}, nil
}

func (t *deliveryTx) PendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingInbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.PendingInbound{}, false, err
	}
	if err := checkPeer(sender); err != nil {
		return persistence.PendingInbound{}, false, err
	}
	b, err := t.bucket(bucketInPending)
	if err != nil {
		return persistence.PendingInbound{}, false, err
	}
	k := msgKey(sender, id)
	v := t.get(b, k)
	if v == nil {
		return persistence.PendingInbound{}, false, nil
	}
	p, err := t.readPendingIn(k, sender, id, v)
	return p, err == nil, err
}

func (t *deliveryTx) PendingInboundAfter(after uint64, sender *messages.DeviceAddress, fn func(persistence.PendingInbound) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	pending, err := t.bucket(bucketInPending)
	if err != nil {
		return err
	}
	visit := func(k []byte) (bool, error) {
		peer, id, err := parseMsgKey(k)
		if err != nil {
			return false, err
		}
		v := t.get(pending, k)
		if v == nil {
			return false, corrupt("pending index", fmt.Errorf("dangling entry %x", k))
		}
		p, err := t.readPendingIn(k, peer, id, v)
		if err != nil {
			return false, err
		}
		if err := t.check(false); err != nil {
			return false, err
		}
		return fn(p)
	}
	if sender != nil {
		if err := checkPeer(*sender); err != nil {
			return err
		}
		idx, err := t.bucket(bucketInPendingSender)
		if err != nil {
			return err
		}
		prefix := addrKey(*sender)
		start := append(bytes.Clone(prefix), u64(after+1)...)
		if after == ^uint64(0) {
			return nil
		}
		return scanFew(idx, start, prefix, func(k, v []byte) (bool, error) {
			if len(v) != 16 {
				return false, corrupt("pending sender index", fmt.Errorf("value of %d bytes", len(v)))
			}
			return visit(append(bytes.Clone(prefix), v...))
		})
	}
	idx, err := t.bucket(bucketInPendingSeq)
	if err != nil {
		return err
	}
	if after == ^uint64(0) {
		return nil
	}
	return scanFew(idx, u64(after+1), nil, func(_, v []byte) (bool, error) { return visit(v) })
}

func (t *deliveryTx) PendingInboundCount(sender *messages.DeviceAddress) (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	if sender == nil {
		n, err := t.counter(inMetaPendingCount)
		return int(n), err
	}
	if err := checkPeer(*sender); err != nil {
		return 0, err
	}
	idx, err := t.bucket(bucketInPendingSender)
	if err != nil {
		return 0, err
	}
	prefix := addrKey(*sender)
	n := 0
	c := idx.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n, nil
}

func (t *deliveryTx) ProcessedInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (persistence.ProcessedInbound, bool, error) {
	var out persistence.ProcessedInbound
	if err := t.check(false); err != nil {
		return out, false, err
	}
	if err := checkPeer(sender); err != nil {
		return out, false, err
	}
	b, err := t.bucket(bucketInProcessed)
	if err != nil {
		return out, false, err
	}
	v := t.get(b, msgKey(sender, id))
	if v == nil {
		return out, false, nil
	}
	r, err := readProcessedRecord(v)
	if err != nil {
		return out, false, err
	}
	pt, err := t.openOf("processed entry", sender, persistence.RecordProcessedEntry, msgIdentity(sender, id), r.Entry)
	if err != nil {
		return out, false, err
	}
	out, err = processedOf(sender, id, pt)
	if err != nil {
		return persistence.ProcessedInbound{}, false, err
	}
	return out, true, nil
}

func (t *deliveryTx) ProcessedInboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	n, err := t.counter(inMetaProcessedCount)
	return int(n), err
}

func (t *deliveryTx) readOutbound(peer messages.DeviceAddress, id messages.LogicalMessageID, v []byte) (persistence.PendingOutbound, error) {
	r, err := readOutboundRecord(v)
	if err != nil {
		return persistence.PendingOutbound{}, err
	}
	body, err := t.openOf("outbound body", peer, persistence.RecordOutboundBody, msgIdentity(peer, id), r.Body)
	if err != nil {
		return persistence.PendingOutbound{}, err
	}
	// open returned a copy: the row never aliases bbolt memory.
	return persistence.PendingOutbound{Recipient: peer, ID: id, Sequence: r.Seq, CreatedAt: r.CreatedAt,
		Attempts: r.Attempts, LastAttemptAt: r.LastAttemptAt, Body: body}, nil
}

func (t *deliveryTx) PendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (persistence.PendingOutbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.PendingOutbound{}, false, err
	}
	if err := checkPeer(recipient); err != nil {
		return persistence.PendingOutbound{}, false, err
	}
	b, err := t.bucket(bucketOutPending)
	if err != nil {
		return persistence.PendingOutbound{}, false, err
	}
	v := t.get(b, msgKey(recipient, id))
	if v == nil {
		return persistence.PendingOutbound{}, false, nil
	}
	p, err := t.readOutbound(recipient, id, v)
	return p, err == nil, err
}

func (t *deliveryTx) PendingOutboundAfter(after uint64, recipient *messages.DeviceAddress, fn func(persistence.PendingOutbound) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	if recipient != nil {
		if err := checkPeer(*recipient); err != nil {
			return err
		}
	}
	out, err := t.bucket(bucketOutPending)
	if err != nil {
		return err
	}
	idx, err := t.bucket(bucketOutPendingSeq)
	if err != nil {
		return err
	}
	if after == ^uint64(0) {
		return nil
	}
	var prefix []byte
	if recipient != nil {
		prefix = addrKey(*recipient)
	}
	return scanFew(idx, u64(after+1), nil, func(_, k []byte) (bool, error) {
		if prefix != nil && !bytes.HasPrefix(k, prefix) {
			return true, nil
		}
		peer, id, err := parseMsgKey(k)
		if err != nil {
			return false, err
		}
		if recipient != nil && peer != *recipient {
			return true, nil
		}
		v := t.get(out, k)
		if v == nil {
			return false, corrupt("outbound index", fmt.Errorf("dangling entry %x", k))
		}
		p, err := t.readOutbound(peer, id, v)
		if err != nil {
			return false, err
		}
		if err := t.check(false); err != nil {
			return false, err
		}
		return fn(p)
	})
}

func (t *deliveryTx) PendingOutboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	n, err := t.counter(inMetaOutCount)
	return int(n), err
}

func (t *deliveryTx) PutPendingInbound(p persistence.PendingInbound) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(p.Sender); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketInPending)
	if err != nil {
		return 0, err
	}
	k := msgKey(p.Sender, p.ID)
	if t.get(b, k) != nil {
		return 0, fmt.Errorf("bolt: pending inbound %s/%s: %w", p.Sender, p.ID, persistence.ErrDuplicate)
	}
	frame, err := t.seal("pending frame", persistence.RecordPendingFrame, msgIdentity(p.Sender, p.ID), p.Frame)
	if err != nil {
		return 0, err
	}
	if frame == nil {
		frame = []byte{}
	}
	seq, err := t.addCounter(inMetaPendingSeq, 1)
	if err != nil {
		return 0, err
	}
	n := p.Deliveries
	rec := encodePendingIn(&pendingInRecord{V: recordVersion, Seq: seq, ReceivedAt: p.ReceivedAt, Frame: frame, Deliveries: &n})
	if err := b.Put(k, rec); err != nil {
		return 0, err
	}
	seqIdx, _ := t.bucket(bucketInPendingSeq)
	var sk [8]byte
	if err := seqIdx.Put(seqKey(&sk, seq), k); err != nil {
		return 0, err
	}
	sIdx, err := t.bucket(bucketInPendingSender)
	if err != nil {
		return 0, err
	}
	// k is the sequence index's value (bbolt keeps it until the commit):
	// the sender key is built apart.
	if err := sIdx.Put(senderSeqKey(&senderKeyBuf{}, k[:len(k)-len(p.ID)], seq), bytes.Clone(p.ID[:])); err != nil {
		return 0, err
	}
	if _, err := t.addCounter(inMetaPendingCount, 1); err != nil {
		return 0, err
	}
	return seq, nil
}

func (t *deliveryTx) CountInboundDelivery(sender messages.DeviceAddress, id messages.LogicalMessageID) (uint32, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(sender); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketInPending)
	if err != nil {
		return 0, err
	}
	k := msgKey(sender, id)
	v := t.get(b, k)
	if v == nil {
		return 0, fmt.Errorf("bolt: pending inbound %s/%s: %w", sender, id, persistence.ErrNotFound)
	}
	r, err := readPendingInRecord(v)
	if err != nil {
		return 0, err
	}
	// Only the plaintext count changes: the sealed frame is kept as is
	// (encoded into a new buffer before the Put, so r.Frame may alias v).
	n := r.deliveries()
	if n == ^uint32(0) {
		return 0, corrupt("pending inbound", fmt.Errorf("delivery count overflow"))
	}
	n++
	r.Deliveries = &n
	return n, b.Put(k, encodePendingIn(&r))
}

func (t *deliveryTx) DeletePendingInbound(sender messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	if err := t.check(true); err != nil {
		return false, err
	}
	if err := checkPeer(sender); err != nil {
		return false, err
	}
	b, err := t.bucket(bucketInPending)
	if err != nil {
		return false, err
	}
	k := msgKey(sender, id)
	v := t.get(b, k)
	if v == nil {
		return false, nil
	}
	r, err := readPendingInRecord(v)
	if err != nil {
		return false, err
	}
	if err := b.Delete(k); err != nil {
		return false, err
	}
	seqIdx, err := t.bucket(bucketInPendingSeq)
	if err != nil {
		return false, err
	}
	var sk [8]byte
	if err := seqIdx.Delete(seqKey(&sk, r.Seq)); err != nil {
		return false, err
	}
	sIdx, err := t.bucket(bucketInPendingSender)
	if err != nil {
		return false, err
	}
	if err := sIdx.Delete(senderSeqKey(&senderKeyBuf{}, k[:len(k)-len(id)], r.Seq)); err != nil {
		return false, err
	}
	_, err = t.addCounter(inMetaPendingCount, -1)
	return err == nil, err
}

func (t *deliveryTx) PutProcessedInbound(p persistence.ProcessedInbound) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := persistence.CheckProcessedInbound(p); err != nil {
		return err
	}
	return t.putProcessed(p)
}

// putProcessed writes a checked processed entry, its prune index entry and
// the count (PutProcessedInbound and ImportLegacyProcessed).
func (t *deliveryTx) putProcessed(p persistence.ProcessedInbound) error {
	b, err := t.bucket(bucketInProcessed)
	if err != nil {
		return err
	}
	k := msgKey(p.Sender, p.ID)
	if t.get(b, k) != nil {
		return fmt.Errorf("bolt: processed inbound %s/%s: %w", p.Sender, p.ID, persistence.ErrDuplicate)
	}
	e := entryOf(p)
	sealedEntry, err := t.seal("processed entry", persistence.RecordProcessedEntry, msgIdentity(p.Sender, p.ID), encodeProcessedEntry(&e))
	if err != nil {
		return err
	}
	if err := b.Put(k, encodeProcessedRecord(&processedRecord{V: processedRecordVersion, Entry: sealedEntry})); err != nil {
		return err
	}
	ti, err := t.bucket(bucketInProcessedTime)
	if err != nil {
		return err
	}
	if err := ti.Put(append(tsKey(p.FinalizedAt), k...), []byte{}); err != nil {
		return err
	}
	_, err = t.addCounter(inMetaProcessedCount, 1)
	return err
}

func (t *deliveryTx) PruneProcessedInbound(cutoff int64) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketInProcessed)
	if err != nil {
		return 0, err
	}
	ti, err := t.bucket(bucketInProcessedTime)
	if err != nil {
		return 0, err
	}
	return t.dropByTime(b, ti, "processed time index", inMetaProcessedCount, -1, tsKey(cutoff))
}

func (t *deliveryTx) PutPendingOutbound(p persistence.PendingOutbound) (uint64, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(p.Recipient); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketOutPending)
	if err != nil {
		return 0, err
	}
	k := msgKey(p.Recipient, p.ID)
	if t.get(b, k) != nil {
		return 0, fmt.Errorf("bolt: pending outbound %s/%s: %w", p.Recipient, p.ID, persistence.ErrDuplicate)
	}
	seq, err := t.addCounter(inMetaOutSeq, 1)
	if err != nil {
		return 0, err
	}
	p.Sequence = seq
	if err := t.putOutbound(b, k, p); err != nil {
		return 0, err
	}
	idx, err := t.bucket(bucketOutPendingSeq)
	if err != nil {
		return 0, err
	}
	var sk [8]byte
	if err := idx.Put(seqKey(&sk, seq), k); err != nil {
		return 0, err
	}
	if _, err := t.addCounter(inMetaOutCount, 1); err != nil {
		return 0, err
	}
	return seq, nil
}

func (t *deliveryTx) putOutbound(b *wbucket, k []byte, p persistence.PendingOutbound) error {
	body, err := t.seal("outbound body", persistence.RecordOutboundBody, msgIdentity(p.Recipient, p.ID), p.Body)
	if err != nil {
		return err
	}
	if body == nil {
		body = []byte{}
	}
	return b.Put(k, encodeOutbound(&outboundRecord{V: recordVersion, Seq: p.Sequence, CreatedAt: p.CreatedAt,
		Attempts: p.Attempts, LastAttemptAt: p.LastAttemptAt, Body: body}))
}

func (t *deliveryTx) MarkOutboundAttempt(recipient messages.DeviceAddress, id messages.LogicalMessageID, at int64) (uint32, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := checkPeer(recipient); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketOutPending)
	if err != nil {
		return 0, err
	}
	k := msgKey(recipient, id)
	v := t.get(b, k)
	if v == nil {
		return 0, fmt.Errorf("bolt: pending outbound %s/%s: %w", recipient, id, persistence.ErrNotFound)
	}
	r, err := readOutboundRecord(v)
	if err != nil {
		return 0, err
	}
	// Only the plaintext metadata changes: keep the sealed body as is
	// (encoded into a new buffer before the Put, so r.Body may alias v).
	r.Attempts++
	r.LastAttemptAt = at
	return r.Attempts, b.Put(k, encodeOutbound(&r))
}

func (t *deliveryTx) DeletePendingOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (bool, error) {
	if err := t.check(true); err != nil {
		return false, err
	}
	if err := checkPeer(recipient); err != nil {
		return false, err
	}
	b, err := t.bucket(bucketOutPending)
	if err != nil {
		return false, err
	}
	k := msgKey(recipient, id)
	v := t.get(b, k)
	if v == nil {
		return false, nil
	}
	r, err := readOutboundRecord(v)
	if err != nil {
		return false, err
	}
	if err := b.Delete(k); err != nil {
		return false, err
	}
	idx, err := t.bucket(bucketOutPendingSeq)
	if err != nil {
		return false, err
	}
	var sk [8]byte
	if err := idx.Delete(seqKey(&sk, r.Seq)); err != nil {
		return false, err
	}
	_, err = t.addCounter(inMetaOutCount, -1)
	return err == nil, err
}

// Reseal functions of the commit-boundary buckets (reseal.go lists them).

// resealPendingIn re-seals the frame of one pending inbound record.
func resealPendingIn(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, id, err := parseMsgKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal pending inbound: %w", err)
	}
	r, err := decodePendingIn(v)
	if err != nil {
		return nil, err
	}
	f, err := resealValue(rot, "pending frame "+peer.String(), persistence.RecordPendingFrame, msgIdentity(peer, id), r.Frame)
	if f == nil || err != nil {
		return nil, err
	}
	r.Frame = f
	return messages.Marshal(&r)
}

// resealProcessed re-seals the sealed entry of one processed record.
func resealProcessed(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, id, err := parseMsgKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal processed inbound: %w", err)
	}
	r, err := decodeProcessed(v)
	if err != nil {
		return nil, err
	}
	e, err := resealValue(rot, "processed entry "+peer.String(), persistence.RecordProcessedEntry, msgIdentity(peer, id), r.Entry)
	if e == nil || err != nil {
		return nil, err
	}
	r.Entry = e
	return messages.Marshal(&r)
}

// resealOutbound re-seals the body of one pending outbound message.
func resealOutbound(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, id, err := parseMsgKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal pending outbound: %w", err)
	}
	r, err := decodeOutbound(v)
	if err != nil {
		return nil, err
	}
	b, err := resealValue(rot, "outbound body "+peer.String(), persistence.RecordOutboundBody, msgIdentity(peer, id), r.Body)
	if b == nil || err != nil {
		return nil, err
	}
	r.Body = b
	return messages.Marshal(&r)
}
