package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Skipped message keys, one entry each beside the session records (layout
// 13; docs/storage.md, "Skipped message keys"): a ratchet step puts and
// deletes only the keys it changed, never the record's other keys.
var (
	bucketDeliverySkipped      = []byte("delivery.skipped")        // addrKey | seq(8) → sealed RecordSkippedKey entry
	bucketDeliverySkippedCount = []byte("delivery.skipped_counts") // addrKey → u64be keys stored for the peer (absent: 0)
)

// counterSkippedKeys (bucketInMeta) counts the skipped keys of all peers:
// the device-wide cap reads it on every step that adds keys.
var counterSkippedKeys = []byte("skipped_keys")

func skippedKeyOf(peer messages.DeviceAddress, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(addrKey(peer), seq)
}

// skippedIdentity is the sealed row identity of skipped key seq of peer:
// an entry moved to another address or number fails to open.
func skippedIdentity(peer messages.DeviceAddress, seq uint64) []byte {
	return sealed.Identity([]byte(peer.User), binary.BigEndian.AppendUint32(nil, peer.Device), binary.BigEndian.AppendUint64(nil, seq))
}

// parseSkippedKey reverses skippedKeyOf.
func parseSkippedKey(k []byte) (messages.DeviceAddress, uint64, error) {
	if len(k) < 8 {
		return messages.DeviceAddress{}, 0, fmt.Errorf("skipped key of %d bytes: %w", len(k), persistence.ErrCorrupt)
	}
	peer, err := parseAddrKey(k[:len(k)-8])
	if err != nil {
		return peer, 0, err
	}
	return peer, binary.BigEndian.Uint64(k[len(k)-8:]), nil
}

// createSkippedV13 creates the skipped-key buckets.
func createSkippedV13(tx *wtx) error {
	for _, name := range [][]byte{bucketDeliverySkipped, bucketDeliverySkippedCount} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// skippedBucket checks the transaction (writable when write) and the
// peer's address, and returns the skipped-key bucket.
func (t *deliveryTx) skippedBucket(peer messages.DeviceAddress, write bool) (*wbucket, error) {
	if err := t.check(write); err != nil {
		return nil, err
	}
	if err := checkPeer(peer); err != nil {
		return nil, err
	}
	return t.bucket(bucketDeliverySkipped)
}

func (t *deliveryTx) SkippedKeys(peer messages.DeviceAddress, fn func(seq uint64, entry []byte) (bool, error)) error {
	b, err := t.skippedBucket(peer, false)
	if err != nil {
		return err
	}
	prefix := addrKey(peer)
	return scan(b, prefix, prefix, func(k, v []byte) (bool, error) {
		if len(k) != len(prefix)+8 {
			return false, corrupt("skipped key of "+peer.String(), fmt.Errorf("key of %d bytes", len(k)))
		}
		seq := binary.BigEndian.Uint64(k[len(prefix):])
		pt, err := t.openOf("skipped key of", peer, persistence.RecordSkippedKey, skippedIdentity(peer, seq), v)
		if err != nil {
			return false, err
		}
		if err := t.check(false); err != nil {
			return false, err
		}
		return fn(seq, pt)
	})
}

func (t *deliveryTx) SkippedKeyCount(peer *messages.DeviceAddress) (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	if peer == nil {
		n, err := t.counter(counterSkippedKeys)
		for _, d := range t.skippedDeltas {
			n = uint64(int64(n) + d)
		}
		return int(n), err
	}
	if err := checkPeer(*peer); err != nil {
		return 0, err
	}
	n, err := t.peerSkippedCount(addrKey(*peer))
	return int(n), err
}

// storedSkippedCount is the peer's count as stored (without this
// transaction's pending changes).
func (t *deliveryTx) storedSkippedCount(ak []byte) (uint64, error) {
	b, err := t.bucket(bucketDeliverySkippedCount)
	if err != nil {
		return 0, err
	}
	v := t.get(b, ak)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, corrupt("skipped key count", fmt.Errorf("%d bytes", len(v)))
	}
	return binary.BigEndian.Uint64(v), nil
}

func (t *deliveryTx) peerSkippedCount(ak []byte) (uint64, error) {
	n, err := t.storedSkippedCount(ak)
	return uint64(int64(n) + t.skippedDeltas[string(ak)]), err
}

// addSkipped notes delta keys for the peer; the counts are written once
// per transaction (flushSkipped), not once per key.
func (t *deliveryTx) addSkipped(ak []byte, delta int64) error {
	if delta == 0 {
		return nil
	}
	if t.skippedDeltas == nil {
		t.skippedDeltas = make(map[string]int64)
	}
	t.skippedDeltas[string(ak)] += delta
	return nil
}

// flushSkipped writes the per-peer counts (deleted at 0) and the device
// total changed by this transaction.
func (t *deliveryTx) flushSkipped() error {
	if len(t.skippedDeltas) == 0 {
		return nil
	}
	b, err := t.bucket(bucketDeliverySkippedCount)
	if err != nil {
		return err
	}
	var total int64
	for ak, d := range t.skippedDeltas {
		if d == 0 {
			continue
		}
		n, err := t.storedSkippedCount([]byte(ak))
		if err != nil {
			return err
		}
		if d < 0 && uint64(-d) > n {
			return corrupt("skipped key count", fmt.Errorf("underflow"))
		}
		if n = uint64(int64(n) + d); n == 0 {
			err = b.Delete([]byte(ak))
		} else {
			err = b.Put([]byte(ak), u64(n))
		}
		if err != nil {
			return err
		}
		total += d
	}
	t.skippedDeltas = nil
	_, err = t.addCounter(counterSkippedKeys, total)
	return err
}

func (t *deliveryTx) PutSkippedKey(peer messages.DeviceAddress, seq uint64, entry []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if len(entry) > persistence.MaxSkippedKeyEntry {
		return fmt.Errorf("bolt: skipped key of %d bytes (at most %d): %w", len(entry), persistence.MaxSkippedKeyEntry, persistence.ErrInvalidRecord)
	}
	b, err := t.bucket(bucketDeliverySkipped)
	if err != nil {
		return err
	}
	k := skippedKeyOf(peer, seq)
	existed := t.get(b, k) != nil
	v, err := t.seal("skipped key of "+peer.String(), persistence.RecordSkippedKey, skippedIdentity(peer, seq), entry)
	if err != nil {
		return err
	}
	if v == nil {
		v = []byte{}
	}
	if err := b.Put(k, v); err != nil {
		return err
	}
	if existed {
		return nil
	}
	return t.addSkipped(addrKey(peer), 1)
}

func (t *deliveryTx) DeleteSkippedKey(peer messages.DeviceAddress, seq uint64) error {
	b, err := t.skippedBucket(peer, true)
	if err != nil {
		return err
	}
	k := skippedKeyOf(peer, seq)
	if t.get(b, k) == nil {
		return nil
	}
	if err := b.Delete(k); err != nil {
		return err
	}
	return t.addSkipped(addrKey(peer), -1)
}

// deleteSkipped deletes up to n (n < 0: all) of peer's keys, lowest
// numbers first, and returns how many it deleted.
func (t *deliveryTx) deleteSkipped(peer messages.DeviceAddress, n int) (int, error) {
	b, err := t.bucket(bucketDeliverySkipped)
	if err != nil {
		return 0, err
	}
	prefix := addrKey(peer)
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if n >= 0 && len(keys) == n {
			break
		}
		keys = append(keys, clone(k))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(keys), t.addSkipped(prefix, -int64(len(keys)))
}

func (t *deliveryTx) EvictSkippedKeys(limit int) ([]persistence.SkippedEviction, error) {
	if err := t.check(true); err != nil {
		return nil, err
	}
	total, err := t.SkippedKeyCount(nil)
	if err != nil || total <= max(limit, 0) {
		return nil, err
	}
	if err := t.flushSkipped(); err != nil {
		return nil, err
	}
	counts, err := t.bucket(bucketDeliverySkippedCount)
	if err != nil {
		return nil, err
	}
	var holders []persistence.SkippedHolder
	if err := counts.ForEach(func(k, v []byte) error {
		peer, err := parseAddrKey(k)
		if err != nil {
			return err
		}
		if len(v) != 8 {
			return corrupt("skipped key count of "+peer.String(), fmt.Errorf("%d bytes", len(v)))
		}
		holders = append(holders, persistence.SkippedHolder{Peer: peer, Count: int(binary.BigEndian.Uint64(v))})
		return nil
	}); err != nil {
		return nil, err
	}
	plan := persistence.PlanSkippedEviction(holders, limit)
	for i, e := range plan {
		n, err := t.deleteSkipped(e.Peer, e.Count)
		if err != nil {
			return nil, err
		}
		if n != e.Count {
			return nil, corrupt("skipped keys of "+e.Peer.String(), fmt.Errorf("count says %d or more, %d stored", e.Count, n))
		}
		plan[i].Count = n
	}
	return plan, nil
}

// resealSkipped re-seals one skipped key; its identity is derived from the
// bucket key (the peer's address and the key's number).
func resealSkipped(rot persistence.KeyRotator, k, v []byte) ([]byte, error) {
	peer, seq, err := parseSkippedKey(k)
	if err != nil {
		return nil, fmt.Errorf("bolt: reseal skipped key: %w", err)
	}
	return resealValue(rot, "skipped key of "+peer.String(), persistence.RecordSkippedKey, skippedIdentity(peer, seq), v)
}
