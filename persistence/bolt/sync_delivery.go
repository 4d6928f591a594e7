package bolt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// SSP/1 §14 delivery buckets. Names are part of the storage format.
var (
	bucketSyncCursors    = []byte("sync.cursors")    // peer path → cursorRecord
	bucketSyncWatermarks = []byte("sync.watermarks") // site(16)|lp(schema)|lp(table) → watermark record
	bucketSyncPeers      = []byte("sync.peers")      // peer path → progressRecord
	// Layout 6: one key per gap and per re-offer, so no list is bounded by
	// a record decoder's element limit (the limits are the persistence
	// constants, checked on write).
	bucketSyncPeerGaps    = []byte("sync.peer_gaps")    // lp(peer)|seq(8) → gapRecord
	bucketSyncCursorRetry = []byte("sync.cursor_retry") // lp(peer)|seq(8) → ∅
)

// createSyncDeliveryV1 creates the SSP/1 §14 buckets (layout 2 → 3).
func createSyncDeliveryV1(tx *wtx) error {
	for _, name := range [][]byte{bucketSyncCursors, bucketSyncWatermarks, bucketSyncPeers} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

const maxPeerKey = 1024

type cursorRecord struct {
	V   uint64 `cbor:"v"`
	Seq uint64 `cbor:"seq"`
}

type watermarkRecord struct {
	V   uint64 `cbor:"v"`
	HLC uint64 `cbor:"hlc"`
	Seq uint64 `cbor:"seq"`
}

// gapRecord is one gap's group (layout 6: the value of its own key).
type gapRecord struct {
	_      struct{} `cbor:",toarray"`
	Site   []byte
	Schema string
	Table  string
}

type progressRecord struct {
	V       uint64 `cbor:"v"`
	Log     []byte `cbor:"log"`
	Through uint64 `cbor:"through"`
}

func peerKey(peer string) ([]byte, error) {
	if peer == "" || len(peer) > maxPeerKey {
		return nil, fmt.Errorf("bolt: peer name of %d bytes", len(peer))
	}
	return []byte(peer), nil
}

// bucket looks up a top-level bucket created by a migration.
func (t *syncTx) bucket(name []byte) (*wbucket, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	b := t.tx.Bucket(name)
	if b == nil {
		return nil, fmt.Errorf("bolt: bucket %s missing: %w", name, persistence.ErrCorrupt)
	}
	return b, nil
}

// seqKeys lists the sequences stored under lp(peer) in b, ascending.
func seqKeys(b *wbucket, peer []byte, fn func(seq uint64, v []byte) error) error {
	prefix := appendLP(nil, peer)
	return scan(b, prefix, prefix, func(k, v []byte) (bool, error) {
		if len(k) != len(prefix)+8 {
			return false, fmt.Errorf("bolt: %d-byte key under a peer: %w", len(k), persistence.ErrCorrupt)
		}
		return true, fn(binary.BigEndian.Uint64(k[len(prefix):]), v)
	})
}

// replaceSeqKeys makes the keys under lp(peer) in b exactly want (sorted,
// unique), writing only the difference; val gives each new key's value.
func replaceSeqKeys(b *wbucket, peer []byte, want []uint64, val func(i int) ([]byte, error), same func(i int, old []byte) bool) error {
	prefix := appendLP(nil, peer)
	var stale [][]byte
	have := map[uint64]bool{}
	err := seqKeys(b, peer, func(seq uint64, v []byte) error {
		i, ok := slices.BinarySearch(want, seq)
		if !ok || !same(i, v) {
			stale = append(stale, binary.BigEndian.AppendUint64(clone(prefix), seq))
			return nil
		}
		have[seq] = true
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range stale {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	for i, seq := range want {
		if have[seq] {
			continue
		}
		v, err := val(i)
		if err != nil {
			return err
		}
		if err := b.Put(binary.BigEndian.AppendUint64(clone(prefix), seq), v); err != nil {
			return err
		}
	}
	return nil
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
	if err != nil {
		return c, false, err
	}
	rb, err := t.bucket(bucketSyncCursorRetry)
	if err != nil {
		return c, false, err
	}
	err = seqKeys(rb, k, func(seq uint64, _ []byte) error {
		c.Retry = append(c.Retry, seq)
		return nil
	})
	return c, err == nil, err
}

func (t *syncTx) PutCursor(peer string, c persistence.SenderCursor) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	k, err := peerKey(peer)
	if err != nil {
		return err
	}
	if len(c.Retry) > persistence.MaxRetry {
		return fmt.Errorf("bolt: cursor of %s: %d re-offers, limit %d: %w", peer, len(c.Retry), persistence.MaxRetry, persistence.ErrLimit)
	}
	b, err := t.bucket(bucketSyncCursors)
	if err != nil {
		return err
	}
	rb, err := t.bucket(bucketSyncCursorRetry)
	if err != nil {
		return err
	}
	v, err := messages.Marshal(&cursorRecord{V: recordVersion, Seq: c.Seq})
	if err != nil {
		return err
	}
	if err := b.Put(k, v); err != nil {
		return err
	}
	want := slices.Compact(slices.Sorted(slices.Values(c.Retry)))
	return replaceSeqKeys(rb, k, want, func(int) ([]byte, error) { return empty, nil }, func(int, []byte) bool { return true })
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

func (t *syncTx) DeleteWatermarks() (int, error) {
	if err := t.checkWrite(); err != nil {
		return 0, err
	}
	if _, err := t.bucket(bucketSyncWatermarks); err != nil {
		return 0, err
	}
	return deleteWatermarks(t.tx)
}

// deleteWatermarks empties the watermark bucket (also layout 5 → 6).
func deleteWatermarks(tx *wtx) (int, error) {
	b := tx.Bucket(bucketSyncWatermarks)
	n := b.Stats().KeyN
	if err := tx.DeleteBucket(bucketSyncWatermarks); err != nil {
		return 0, err
	}
	_, err := tx.CreateBucket(bucketSyncWatermarks)
	return n, err
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
	if err != nil {
		return p, false, err
	}
	gb, err := t.bucket(bucketSyncPeerGaps)
	if err != nil {
		return p, false, err
	}
	err = seqKeys(gb, k, func(seq uint64, v []byte) error {
		g, err := decodeGap(v)
		p.Gaps = append(p.Gaps, persistence.PeerGap{Seq: seq, Group: g})
		return err
	})
	return p, err == nil, err
}

func decodeGap(v []byte) (persistence.GroupKey, error) {
	var rec gapRecord
	if err := messages.Unmarshal("peer gap", v, &rec, maxRecordSize); err != nil {
		return persistence.GroupKey{}, corrupt("peer gap", err)
	}
	site, err := siteFrom(rec.Site)
	if err != nil {
		return persistence.GroupKey{}, corrupt("peer gap", err)
	}
	return persistence.GroupKey{Site: site, Schema: rec.Schema, Table: rec.Table}, nil
}

func encodeGap(g persistence.GroupKey) ([]byte, error) {
	return messages.Marshal(&gapRecord{Site: g.Site[:], Schema: g.Schema, Table: g.Table})
}

func (t *syncTx) PutPeerProgress(peer string, p persistence.PeerProgress) error {
	if err := t.checkWrite(); err != nil {
		return err
	}
	k, err := peerKey(peer)
	if err != nil {
		return err
	}
	if len(p.Gaps) > persistence.MaxPeerGaps {
		return fmt.Errorf("bolt: progress of %s: %d gaps, limit %d: %w", peer, len(p.Gaps), persistence.MaxPeerGaps, persistence.ErrLimit)
	}
	b, err := t.bucket(bucketSyncPeers)
	if err != nil {
		return err
	}
	gb, err := t.bucket(bucketSyncPeerGaps)
	if err != nil {
		return err
	}
	v, err := messages.Marshal(&progressRecord{V: recordVersion, Log: p.Log, Through: p.Through})
	if err != nil {
		return err
	}
	if err := b.Put(k, v); err != nil {
		return err
	}
	gaps := slices.Clone(p.Gaps)
	slices.SortFunc(gaps, func(a, b persistence.PeerGap) int { return cmpU64(a.Seq, b.Seq) })
	gaps = slices.CompactFunc(gaps, func(a, b persistence.PeerGap) bool { return a.Seq == b.Seq })
	seqs := make([]uint64, len(gaps))
	enc := make([][]byte, len(gaps))
	for i, g := range gaps {
		seqs[i] = g.Seq
		if enc[i], err = encodeGap(g.Group); err != nil {
			return err
		}
	}
	return replaceSeqKeys(gb, k, seqs, func(i int) ([]byte, error) { return enc[i], nil }, func(i int, old []byte) bool { return bytes.Equal(old, enc[i]) })
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// decodeCursor reads a cursor record (its re-offers live in their own keys).
func decodeCursor(v []byte) (persistence.SenderCursor, error) {
	var rec cursorRecord
	if err := decodeRecord("cursor", v, &rec, &rec.V); err != nil {
		return persistence.SenderCursor{}, err
	}
	return persistence.SenderCursor{Seq: rec.Seq}, nil
}

// decodeProgress reads a progress record (its gaps live in their own keys).
func decodeProgress(v []byte) (persistence.PeerProgress, error) {
	var rec progressRecord
	if err := decodeRecord("peer progress", v, &rec, &rec.V); err != nil {
		return persistence.PeerProgress{}, err
	}
	return persistence.PeerProgress{Log: rec.Log, Through: rec.Through}, nil
}
