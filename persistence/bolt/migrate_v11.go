package bolt

import (
	"fmt"

	"github.com/syncmesh/syncmesh/crypto/digest"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// resealDeliveryV11 is layout 11 (docs/delivery.md,
// "Sealed pins and processed entries"): someone who can write the file but
// lacks the storage key must not be able to change who may speak as a
// device, or what a processed entry says.
//
//   - Every pin (64 plaintext bytes until now) is sealed as RecordPin with
//     the address in the associated data.
//   - Every processed entry of layout 10 (kind, time and reason in
//     plaintext, the digest sealed on its own) is rewritten as one sealed
//     RecordProcessedEntry holding all of them. The prune index keeps its
//     keys: the time does not change.
//
// What it does not vouch for: a layout-10 entry without digest (layout 10
// never wrote one, so it is damage or tampering) and a record that does
// not decode are left as they are and read as ErrCorrupt; this migration
// never writes the legacy marker. A digest that does not open under the
// Sealer, or a device identity that does not (the wrong storage key),
// fails the migration: the transaction rolls back, the file stays at
// layout 10 and Open returns ErrCorrupt, so nothing is sealed under a key
// that cannot read the rest of the file.
func resealDeliveryV11(tx *wtx, s persistence.Sealer) error {
	if err := checkKeyV11(tx, s); err != nil {
		return err
	}
	seal := func(rt persistence.RecordType, identity, pt []byte) ([]byte, error) {
		if s == nil {
			return clone(pt), nil
		}
		return s.Seal(rt, identity, pt)
	}
	type kv struct{ k, v []byte }

	pins := tx.Bucket(bucketDeliveryPins)
	if pins == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketDeliveryPins, persistence.ErrCorrupt)
	}
	var todo []kv
	if err := pins.ForEach(func(k, v []byte) error {
		peer, err := parseAddrKey(k)
		if err != nil || len(v) != 64 {
			return nil // damaged: left as is, it reads as ErrCorrupt
		}
		sv, err := seal(persistence.RecordPin, pinIdentity(peer), v)
		if err != nil {
			return fmt.Errorf("seal pin %s: %w", peer, err)
		}
		todo = append(todo, kv{clone(k), sv})
		return nil
	}); err != nil {
		return err
	}
	for _, e := range todo {
		if err := pins.Put(e.k, e.v); err != nil {
			return err
		}
	}

	processed := tx.Bucket(bucketInProcessed)
	if processed == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketInProcessed, persistence.ErrCorrupt)
	}
	todo = todo[:0]
	if err := processed.ForEach(func(k, v []byte) error {
		peer, id, err := parseMsgKey(k)
		if err != nil {
			return nil
		}
		r, err := decodeProcessedV1(v)
		if err != nil || r.Digest == nil {
			return nil // damaged, or no digest: left as is, it reads as ErrCorrupt
		}
		stored := r.Digest
		if s != nil {
			if stored, err = s.Open(persistence.RecordProcessedDigest, msgIdentity(peer, id), r.Digest); err != nil {
				return corrupt("processed digest "+peer.String(), err)
			}
		}
		d, err := digest.DecodeStored(stored)
		if err != nil {
			return corrupt("processed digest "+peer.String(), err)
		}
		p := persistence.ProcessedInbound{Sender: peer, ID: id, Finalization: persistence.Finalization(r.Kind),
			FinalizedAt: r.FinalizedAt, Digest: &d, Reason: persistence.DiscardReason(r.Reason)}
		e := entryOf(p)
		pt, err := messages.Marshal(&e)
		if err != nil {
			return err
		}
		se, err := seal(persistence.RecordProcessedEntry, msgIdentity(peer, id), pt)
		if err != nil {
			return fmt.Errorf("seal processed entry %s: %w", peer, err)
		}
		nv, err := messages.Marshal(&processedRecord{V: processedRecordVersion, Entry: se})
		if err != nil {
			return err
		}
		todo = append(todo, kv{clone(k), nv})
		return nil
	}); err != nil {
		return err
	}
	for _, e := range todo {
		if err := processed.Put(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

// checkKeyV11 opens the device identity, when there is one, with the
// Sealer given: a wrong storage key must fail the migration before it
// seals the pins (until now plaintext, so nothing else would notice).
func checkKeyV11(tx *wtx, s persistence.Sealer) error {
	if s == nil {
		return nil
	}
	meta := tx.Bucket(bucketDeliveryMeta)
	if meta == nil {
		return fmt.Errorf("bucket %s missing: %w", bucketDeliveryMeta, persistence.ErrCorrupt)
	}
	v := meta.Get(deliveryKeyIdentity)
	if v == nil {
		return nil
	}
	if _, err := s.Open(persistence.RecordIdentity, sealed.DeviceIdentity(), v); err != nil {
		return corrupt("local identity (is this the file's storage key?)", err)
	}
	return nil
}
