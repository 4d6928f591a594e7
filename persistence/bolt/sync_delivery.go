package bolt

import (
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// SSP/1 §14 delivery buckets. Names are part of the storage format.
var (
	bucketSyncCursors    = []byte("sync.cursors")    // peer path → senderCursor record
	bucketSyncWatermarks = []byte("sync.watermarks") // site(16)|lp(schema)|lp(table) → watermark record
	bucketSyncPeers      = []byte("sync.peers")      // peer path → peerProgress record
)

// createSyncDeliveryV1 creates the SSP/1 §14 buckets (layout 2 → 3).
func createSyncDeliveryV1(tx *bbolt.Tx) error {
	for _, name := range [][]byte{bucketSyncCursors, bucketSyncWatermarks, bucketSyncPeers} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

const maxPeerKey = 1024

type cursorRecord struct {
	V     uint64   `cbor:"v"`
	Seq   uint64   `cbor:"seq"`
	Retry []uint64 `cbor:"retry"`
}

type watermarkRecord struct {
	V   uint64 `cbor:"v"`
	HLC uint64 `cbor:"hlc"`
	Seq uint64 `cbor:"seq"`
}

type gapRecord struct {
	_      struct{} `cbor:",toarray"`
	Seq    uint64
	Site   []byte
	Schema string
	Table  string
}

type progressRecord struct {
	V       uint64      `cbor:"v"`
	Log     []byte      `cbor:"log"`
	Through uint64      `cbor:"through"`
	Gaps    []gapRecord `cbor:"gaps"`
}

func peerKey(peer string) ([]byte, error) {
	if peer == "" || len(peer) > maxPeerKey {
		return nil, fmt.Errorf("bolt: peer name of %d bytes", len(peer))
	}
	return []byte(peer), nil
}

// bucket looks up a top-level bucket created by a migration.
func (t *syncTx) bucket(name []byte) (*bbolt.Bucket, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	b := t.tx.Bucket(name)
	if b == nil {
		return nil, fmt.Errorf("bolt: bucket %s missing: %w", name, persistence.ErrCorrupt)
	}
	return b, nil
}

func (t *syncTx) Cursor(peer string) (persistence.SenderCursor, bool, error) {
	k, err := peerKey(peer)
	if err != nil {
		return persistence.SenderCursor{}, false, err
	}
	b, err := t.bucket(bucketSyncCursors)
	if err != nil {
		return persistence.SenderCursor{}, false, err
	}
	v := b.Get(k)
	if v == nil {
		return persistence.SenderCursor{}, false, nil
	}
	c, err := decodeCursor(v)
	return c, err == nil, err
}

func decodeCursor(v []byte) (persistence.SenderCursor, error) {
	var rec cursorRecord
	if err := decodeRecord("cursor", v, &rec, &rec.V); err != nil {
		return persistence.SenderCursor{}, err
	}
	return persistence.SenderCursor{Seq: rec.Seq, Retry: rec.Retry}, nil
}

func (t *syncTx) PutCursor(peer string, c persistence.SenderCursor) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	k, err := peerKey(peer)
	if err != nil {
		return err
	}
	b, err := t.bucket(bucketSyncCursors)
	if err != nil {
		return err
	}
	v, err := messages.Marshal(&cursorRecord{V: recordVersion, Seq: c.Seq, Retry: c.Retry})
	if err != nil {
		return err
	}
	return b.Put(k, v)
}

func decodeWatermark(v []byte) (persistence.Watermark, error) {
	var rec watermarkRecord
	if err := decodeRecord("watermark", v, &rec, &rec.V); err != nil {
		return persistence.Watermark{}, err
	}
	return persistence.Watermark{HLC: messages.HLC(rec.HLC), Seq: rec.Seq}, nil
}

func (t *syncTx) Watermark(g persistence.GroupKey) (persistence.Watermark, bool, error) {
	b, err := t.bucket(bucketSyncWatermarks)
	if err != nil {
		return persistence.Watermark{}, false, err
	}
	v := b.Get(groupPrefix(nil, g))
	if v == nil {
		return persistence.Watermark{}, false, nil
	}
	w, err := decodeWatermark(v)
	return w, err == nil, err
}

func (t *syncTx) Watermarks(fn func(g persistence.GroupKey, w persistence.Watermark) (bool, error)) error {
	b, err := t.bucket(bucketSyncWatermarks)
	if err != nil {
		return err
	}
	return scan(b, nil, nil, func(k, v []byte) (bool, error) {
		// The key is a group prefix; reuse the held-key parser with a
		// zero sequence appended.
		g, _, err := parseGroupKey(append(clone(k), make([]byte, 8)...))
		if err != nil {
			return false, err
		}
		w, err := decodeWatermark(v)
		if err != nil {
			return false, err
		}
		return fn(g, w)
	})
}

func (t *syncTx) PutWatermark(g persistence.GroupKey, w persistence.Watermark) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	b, err := t.bucket(bucketSyncWatermarks)
	if err != nil {
		return err
	}
	k := groupPrefix(nil, g)
	if old := b.Get(k); old != nil {
		prev, err := decodeWatermark(old)
		if err != nil {
			return err
		}
		if w.HLC < prev.HLC {
			return fmt.Errorf("bolt: watermark %v → %v: %w", prev.HLC, w.HLC, persistence.ErrWatermarkRegression)
		}
	}
	v, err := messages.Marshal(&watermarkRecord{V: recordVersion, HLC: uint64(w.HLC), Seq: w.Seq})
	if err != nil {
		return err
	}
	return b.Put(k, v)
}

func (t *syncTx) PeerProgress(peer string) (persistence.PeerProgress, bool, error) {
	k, err := peerKey(peer)
	if err != nil {
		return persistence.PeerProgress{}, false, err
	}
	b, err := t.bucket(bucketSyncPeers)
	if err != nil {
		return persistence.PeerProgress{}, false, err
	}
	v := b.Get(k)
	if v == nil {
		return persistence.PeerProgress{}, false, nil
	}
	p, err := decodeProgress(v)
	return p, err == nil, err
}

func decodeProgress(v []byte) (persistence.PeerProgress, error) {
	var rec progressRecord
	if err := decodeRecord("peer progress", v, &rec, &rec.V); err != nil {
		return persistence.PeerProgress{}, err
	}
	p := persistence.PeerProgress{Log: rec.Log, Through: rec.Through}
	for _, g := range rec.Gaps {
		site, err := siteFrom(g.Site)
		if err != nil {
			return persistence.PeerProgress{}, corrupt("peer progress", err)
		}
		p.Gaps = append(p.Gaps, persistence.PeerGap{Seq: g.Seq, Group: persistence.GroupKey{Site: site, Schema: g.Schema, Table: g.Table}})
	}
	return p, nil
}

func (t *syncTx) PutPeerProgress(peer string, p persistence.PeerProgress) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	k, err := peerKey(peer)
	if err != nil {
		return err
	}
	b, err := t.bucket(bucketSyncPeers)
	if err != nil {
		return err
	}
	rec := progressRecord{V: recordVersion, Log: p.Log, Through: p.Through, Gaps: make([]gapRecord, 0, len(p.Gaps))}
	for _, g := range p.Gaps {
		rec.Gaps = append(rec.Gaps, gapRecord{Seq: g.Seq, Site: g.Group.Site[:], Schema: g.Group.Schema, Table: g.Group.Table})
	}
	v, err := messages.Marshal(&rec)
	if err != nil {
		return err
	}
	return b.Put(k, v)
}
