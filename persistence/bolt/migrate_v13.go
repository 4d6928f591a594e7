package bolt

import (
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/persistence"
)

// splitSkippedV13 is layout 13 (docs/storage.md,
// "Skipped message keys"): every session record that holds skipped message
// keys is rewritten without them (ratchet.MarshalStateWithoutKeys), and
// each key is stored as its own sealed entry (RecordSkippedKey, the
// address and the key's number in the associated data) in
// bucketDeliverySkipped, with the per-peer and device counts. Afterwards a
// ratchet step writes the small record and only the keys it changed.
//
// The keys keep their values and times; a record of state version 1 or 2
// numbers its keys in order here (what UnmarshalState does on load). A
// session record that opens but does not decode as a ratchet record is
// left as it is (it reads as before, and the session layer reports it
// corrupt). A record or device identity that does not open under the
// Sealer (the wrong storage key) fails the migration: the transaction
// rolls back, the file stays at layout 12 and Open returns ErrCorrupt, so
// no key is written under a storage key that cannot read the rest.
func splitSkippedV13(tx *wtx, s persistence.Sealer) error {
	if err := checkKeyV11(tx, s); err != nil {
		return err
	}
	if err := createSkippedV13(tx); err != nil {
		return err
	}
	seal := func(rt persistence.RecordType, identity, pt []byte) ([]byte, error) {
		if s == nil {
			return clone(pt), nil
		}
		return s.Seal(rt, identity, pt)
	}
	sessions := tx.Bucket(bucketDeliverySessions)
	if sessions == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketDeliverySessions, persistence.ErrCorrupt)
	}
	type split struct {
		k, state []byte
		keys     []ratchet.SkippedKey
	}
	var todo []split
	if err := sessions.ForEach(func(k, v []byte) error {
		peer, err := parseAddrKey(k)
		if err != nil {
			return nil // damaged: left as is, it reads as ErrCorrupt
		}
		pt := v
		if s != nil {
			if pt, err = s.Open(persistence.RecordSession, sessionIdentity(peer), v); err != nil {
				return corrupt("session "+peer.String()+" (is this the file's storage key?)", err)
			}
		}
		rec, err := ratchet.UnmarshalState(pt)
		if err != nil {
			return nil // not a ratchet record: left as is
		}
		keys := ratchet.SkippedKeys(rec)
		if len(keys) == 0 {
			return nil // nothing to split: the record reads as it is
		}
		state, err := ratchet.MarshalStateWithoutKeys(rec)
		if err != nil {
			return err
		}
		sv, err := seal(persistence.RecordSession, sessionIdentity(peer), state)
		if err != nil {
			return fmt.Errorf("seal session %s: %w", peer, err)
		}
		todo = append(todo, split{k: clone(k), state: sv, keys: keys})
		return nil
	}); err != nil {
		return err
	}
	skipped := tx.Bucket(bucketDeliverySkipped)
	counts := tx.Bucket(bucketDeliverySkippedCount)
	total := uint64(0)
	for _, e := range todo {
		peer, _ := parseAddrKey(e.k)
		for _, key := range e.keys {
			if len(key.Entry) > persistence.MaxSkippedKeyEntry {
				return fmt.Errorf("skipped key of %s: %d bytes: %w", peer, len(key.Entry), persistence.ErrInvalidRecord)
			}
			v, err := seal(persistence.RecordSkippedKey, skippedIdentity(peer, key.Seq), key.Entry)
			if err != nil {
				return fmt.Errorf("seal skipped key of %s: %w", peer, err)
			}
			if err := skipped.Put(skippedKeyOf(peer, key.Seq), v); err != nil {
				return err
			}
		}
		if err := counts.Put(e.k, u64(uint64(len(e.keys)))); err != nil {
			return err
		}
		total += uint64(len(e.keys))
		if err := sessions.Put(e.k, e.state); err != nil {
			return err
		}
	}
	in := tx.Bucket(bucketInMeta)
	if in == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketInMeta, persistence.ErrCorrupt)
	}
	return in.Put(counterSkippedKeys, u64(total))
}
