package memory

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/persistence"
)

const maxPeerKey = 1024

func checkPeerName(peer string) error {
	if peer == "" || len(peer) > maxPeerKey {
		return fmt.Errorf("memory: peer name of %d bytes", len(peer))
	}
	return nil
}

func (t *txn) Cursor(peer string) (persistence.SenderCursor, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.SenderCursor{}, false, err
	}
	if err := checkPeerName(peer); err != nil {
		return persistence.SenderCursor{}, false, err
	}
	c, ok := t.st.cursors.get(peer)
	c.Retry = slices.Clone(c.Retry)
	return c, ok, nil
}

func (t *txn) PutCursor(peer string, c persistence.SenderCursor) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeerName(peer); err != nil {
		return err
	}
	if len(c.Retry) > persistence.MaxRetry {
		return fmt.Errorf("memory: cursor of %s: %d re-offers, limit %d: %w", peer, len(c.Retry), persistence.MaxRetry, persistence.ErrLimit)
	}
	c.Retry = slices.Compact(slices.Sorted(slices.Values(c.Retry)))
	t.st.cursors.put(peer, c)
	return nil
}

func (t *txn) Watermark(g persistence.GroupKey) (persistence.Watermark, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.Watermark{}, false, err
	}
	w, ok := t.st.watermarks.get(g)
	return w, ok, nil
}

func (t *txn) Watermarks(fn func(g persistence.GroupKey, w persistence.Watermark) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	type entry struct {
		g persistence.GroupKey
		w persistence.Watermark
	}
	var all []entry
	t.st.watermarks.each(func(g persistence.GroupKey, w persistence.Watermark) { all = append(all, entry{g, w}) })
	slices.SortFunc(all, func(a, b entry) int {
		if c := bytes.Compare(a.g.Site[:], b.g.Site[:]); c != 0 {
			return c
		}
		return bytes.Compare(tableSortKey(a.g.Schema, a.g.Table), tableSortKey(b.g.Schema, b.g.Table))
	})
	for _, e := range all {
		cont, err := fn(e.g, e.w)
		if err != nil || !cont {
			return err
		}
	}
	return nil
}

func (t *txn) PutWatermark(g persistence.GroupKey, w persistence.Watermark) error {
	if err := t.check(true); err != nil {
		return err
	}
	if prev, ok := t.st.watermarks.get(g); ok && w.HLC < prev.HLC {
		return fmt.Errorf("memory: watermark %v → %v: %w", prev.HLC, w.HLC, persistence.ErrWatermarkRegression)
	}
	t.st.watermarks.put(g, w)
	return nil
}

func (t *txn) PeerProgress(peer string) (persistence.PeerProgress, bool, error) {
	if err := t.check(false); err != nil {
		return persistence.PeerProgress{}, false, err
	}
	if err := checkPeerName(peer); err != nil {
		return persistence.PeerProgress{}, false, err
	}
	p, ok := t.st.peers.get(peer)
	p.Log = cloneBytes(p.Log)
	p.Gaps = slices.Clone(p.Gaps)
	return p, ok, nil
}

func (t *txn) PutPeerProgress(peer string, p persistence.PeerProgress) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeerName(peer); err != nil {
		return err
	}
	if len(p.Gaps) > persistence.MaxPeerGaps {
		return fmt.Errorf("memory: progress of %s: %d gaps, limit %d: %w", peer, len(p.Gaps), persistence.MaxPeerGaps, persistence.ErrLimit)
	}
	p.Log = cloneBytes(p.Log)
	p.Gaps = slices.Clone(p.Gaps)
	slices.SortFunc(p.Gaps, func(a, b persistence.PeerGap) int { return cmp.Compare(a.Seq, b.Seq) })
	p.Gaps = slices.CompactFunc(p.Gaps, func(a, b persistence.PeerGap) bool { return a.Seq == b.Seq })
	t.st.peers.put(peer, p)
	return nil
}

func (t *txn) DeleteWatermarks() (int, error) {
	if err := t.check(true); err != nil {
		return 0, err
	}
	var gs []persistence.GroupKey
	t.st.watermarks.each(func(g persistence.GroupKey, _ persistence.Watermark) { gs = append(gs, g) })
	for _, g := range gs {
		t.st.watermarks.del(g)
	}
	return len(gs), nil
}
