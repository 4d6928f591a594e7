package bolt

import (
	"bytes"
	"fmt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Retired outbound buckets (layout 15, createRetiredV15). Names are part of
// the storage format; msgKey and ts as in inbound.go.
var (
	bucketOutRetired     = []byte("delivery.out_retired")      // msgKey → retiredRecord (entry sealed)
	bucketOutRetiredTime = []byte("delivery.out_retired_time") // ts|msgKey → ∅ (prune and eviction index)
)

// inMetaRetiredCount counts the retired entries (bucketInMeta).
var inMetaRetiredCount = []byte("out_retired_count")

// createRetiredV15 creates the retired outbound buckets (layout 14 → 15):
// a file of layout 14 retired nothing it can still remember.
func createRetiredV15(tx *wtx) error {
	for _, name := range [][]byte{bucketOutRetired, bucketOutRetiredTime} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// retiredRecord is a retired outbound entry: everything but the row's key
// is one sealed RecordRetiredOutbound (retiredEntry), so neither the body
// digest nor how and when it was retired can be read or changed without
// the storage key. The time is also in the plaintext index.
type retiredRecord struct {
	V     uint64 `cbor:"1,keyasint"` // recordVersion
	Entry []byte `cbor:"2,keyasint"` // sealed RecordRetiredOutbound: retiredEntry
}

// retiredEntry is the sealed plaintext of a retiredRecord.
type retiredEntry struct {
	How       uint8  `cbor:"1,keyasint"`
	RetiredAt int64  `cbor:"2,keyasint"`
	Digest    []byte `cbor:"3,keyasint"` // ApplicationMessageDigest v1, 32 bytes
}

func decodeRetired(b []byte) (retiredRecord, error) {
	var r retiredRecord
	if err := decodeRecord("retired outbound", b, &r, &r.V); err != nil {
		return r, err
	}
	if r.Entry == nil {
		return r, corrupt("retired outbound", fmt.Errorf("no sealed entry"))
	}
	return r, nil
}

// retiredOf decodes an opened retiredEntry of (recipient, id) and checks
// it (persistence.CheckRetiredOutbound).
func retiredOf(recipient messages.DeviceAddress, id messages.LogicalMessageID, pt []byte) (persistence.RetiredOutbound, error) {
	what := "retired entry " + recipient.String()
	var e retiredEntry
	if err := messages.Unmarshal(what, pt, &e, maxRecordSize); err != nil {
		return persistence.RetiredOutbound{}, corrupt(what, err)
	}
	r := persistence.RetiredOutbound{Recipient: recipient, ID: id, How: persistence.Retirement(e.How), RetiredAt: e.RetiredAt}
	if len(e.Digest) != len(r.Digest) {
		return persistence.RetiredOutbound{}, corrupt(what, fmt.Errorf("digest of %d bytes", len(e.Digest)))
	}
	copy(r.Digest[:], e.Digest)
	if err := persistence.CheckRetiredOutbound(r); err != nil {
		return persistence.RetiredOutbound{}, corrupt(what, err)
	}
	return r, nil
}

func (t *deliveryTx) RetiredOutbound(recipient messages.DeviceAddress, id messages.LogicalMessageID) (persistence.RetiredOutbound, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.RetiredOutbound{}, false, err
	}
	if err := checkPeer(recipient); err != nil {
		return persistence.RetiredOutbound{}, false, err
	}
	b, err := t.bucket(bucketOutRetired)
	if err != nil {
		return persistence.RetiredOutbound{}, false, err
	}
	v := t.get(b, msgKey(recipient, id))
	if v == nil {
		return persistence.RetiredOutbound{}, false, nil
	}
	r, err := t.readRetired(recipient, id, v)
	return r, err == nil, err
}

func (t *deliveryTx) readRetired(recipient messages.DeviceAddress, id messages.LogicalMessageID, v []byte) (persistence.RetiredOutbound, error) {
	rec, err := decodeRetired(v)
	if err != nil {
		return persistence.RetiredOutbound{}, err
	}
	pt, err := t.openOf("retired entry", recipient, persistence.RecordRetiredOutbound, msgIdentity(recipient, id), rec.Entry)
	if err != nil {
		return persistence.RetiredOutbound{}, err
	}
	return retiredOf(recipient, id, pt)
}

func (t *deliveryTx) RetiredOutboundCount() (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	n, err := t.counter(inMetaRetiredCount)
	return int(n), err
}

func (t *deliveryTx) PutRetiredOutbound(r persistence.RetiredOutbound) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	if err := persistence.CheckRetiredOutbound(r); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketOutRetired)
	if err != nil {
		return 0, err
	}
	ti, err := t.bucket(bucketOutRetiredTime)
	if err != nil {
		return 0, err
	}
	k := msgKey(r.Recipient, r.ID)
	if v := t.get(b, k); v != nil {
		// Replaced: its index entry goes with it.
		old, err := t.readRetired(r.Recipient, r.ID, v)
		if err != nil {
			return 0, err
		}
		if err := ti.Delete(append(tsKey(old.RetiredAt), k...)); err != nil {
			return 0, err
		}
		if _, err := t.addCounter(inMetaRetiredCount, -1); err != nil {
			return 0, err
		}
	}
	e := retiredEntry{How: uint8(r.How), RetiredAt: r.RetiredAt, Digest: r.Digest[:]}
	pt, err := messages.Marshal(&e)
	if err != nil {
		return 0, err
	}
	sealedEntry, err := t.seal("retired entry", persistence.RecordRetiredOutbound, msgIdentity(r.Recipient, r.ID), pt)
	if err != nil {
		return 0, err
	}
	v, err := messages.Marshal(&retiredRecord{V: recordVersion, Entry: sealedEntry})
	if err != nil {
		return 0, err
	}
	if err := b.Put(k, v); err != nil {
		return 0, err
	}
	if err := ti.Put(append(tsKey(r.RetiredAt), k...), []byte{}); err != nil {
		return 0, err
	}
	n, err := t.addCounter(inMetaRetiredCount, 1)
	if err != nil || n <= persistence.MaxRetiredOutbound {
		return 0, err
	}
	return t.dropRetired(b, ti, int(n-persistence.MaxRetiredOutbound), nil)
}

func (t *deliveryTx) PruneRetiredOutbound(cutoff int64) (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	b, err := t.bucket(bucketOutRetired)
	if err != nil {
		return 0, err
	}
	ti, err := t.bucket(bucketOutRetiredTime)
	if err != nil {
		return 0, err
	}
	end := tsKey(cutoff)
	return t.dropRetired(b, ti, -1, end)
}

// dropRetired removes the oldest retired entries in index order: at most
// limit of them (-1: no limit), only those whose time is ≤ end when end is
// not nil.
func (t *deliveryTx) dropRetired(b, ti *wbucket, limit int, end []byte) (int, error) {
	return t.dropByTime(b, ti, "retired time index", inMetaRetiredCount, limit, end)
}

// dropByTime removes the oldest entries of b in the order of its time
// index ti (keys: time(8) | b's key) and lowers counter by as many: at
// most limit of them (-1: no limit), only those whose time is ≤ end when
// end is not nil. An index key naming no entry is corruption.
func (t *deliveryTx) dropByTime(b, ti *wbucket, index string, counter []byte, limit int, end []byte) (int, error) {
	var drop [][]byte
	c := ti.Cursor()
	for k, _ := c.First(); k != nil && (limit < 0 || len(drop) < limit); k, _ = c.Next() {
		if len(k) < 8 {
			return 0, corrupt(index, fmt.Errorf("key of %d bytes", len(k)))
		}
		if end != nil && bytes.Compare(k[:8], end) > 0 {
			break
		}
		drop = append(drop, clone(k))
	}
	for _, k := range drop {
		if err := ti.Delete(k); err != nil {
			return 0, err
		}
		if t.get(b, k[8:]) == nil {
			return 0, corrupt(index, fmt.Errorf("dangling entry %x", k))
		}
		if err := b.Delete(k[8:]); err != nil {
			return 0, err
		}
	}
	if len(drop) > 0 {
		if _, err := t.addCounter(counter, -int64(len(drop))); err != nil {
			return 0, err
		}
	}
	return len(drop), nil
}

// resealRetired re-seals the sealed entry of one retired record (reseal.go
// lists it).
func resealRetired(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, id, err := parseMsgKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal retired outbound: %w", err)
	}
	r, err := decodeRetired(v)
	if err != nil {
		return nil, err
	}
	e, err := resealValue(rot, "retired entry "+peer.String(), persistence.RecordRetiredOutbound, msgIdentity(peer, id), r.Entry)
	if e == nil || err != nil {
		return nil, err
	}
	r.Entry = e
	return messages.Marshal(&r)
}

func (t *deliveryTx) OutboundSequence() (uint64, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.counter(inMetaOutSeq)
}

func (t *deliveryTx) RaiseOutboundSequence(floor uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	c, err := t.cachedCounter(inMetaOutSeq)
	if err != nil || c.v >= floor {
		return err
	}
	c.v, c.dirty = floor, true
	return nil
}
