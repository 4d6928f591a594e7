package memory

import (
	"fmt"
	"slices"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Skipped message keys, one entry each (persistence.DeliveryReader
// SkippedKeys): staged per transaction over the committed maps, so a step
// costs what it changes, not the peer's other keys.

// committedSkipped reports whether (peer, seq) is committed and not
// cleared by this transaction.
func (t *deliveryTxn) committedSkipped(peer messages.DeviceAddress, seq uint64) bool {
	if t.skippedCleared[peer] {
		return false
	}
	_, ok := t.d.skipped[peer][seq]
	return ok
}

func (t *deliveryTxn) getSkipped(peer messages.DeviceAddress, seq uint64) ([]byte, bool) {
	if v, staged := t.skipped[peer][seq]; staged {
		return v, v != nil
	}
	if !t.committedSkipped(peer, seq) {
		return nil, false
	}
	return t.d.skipped[peer][seq], true
}

// peerSkipped is the number of peer's keys as this transaction sees them.
func (t *deliveryTxn) peerSkipped(peer messages.DeviceAddress) int {
	n := 0
	if !t.skippedCleared[peer] {
		n = len(t.d.skipped[peer])
	}
	for seq, v := range t.skipped[peer] {
		had := t.committedSkipped(peer, seq)
		if v != nil && !had {
			n++
		} else if v == nil && had {
			n--
		}
	}
	return n
}

// skippedSeqs returns peer's key numbers as this transaction sees them,
// ascending.
func (t *deliveryTxn) skippedSeqs(peer messages.DeviceAddress) []uint64 {
	var out []uint64
	if !t.skippedCleared[peer] {
		for seq := range t.d.skipped[peer] {
			if v, staged := t.skipped[peer][seq]; !staged || v != nil {
				out = append(out, seq)
			}
		}
	}
	for seq, v := range t.skipped[peer] {
		if v != nil && !t.committedSkipped(peer, seq) {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
	return out
}

func (t *deliveryTxn) stageSkipped(peer messages.DeviceAddress, seq uint64, v []byte) {
	if t.skipped == nil {
		t.skipped = make(map[messages.DeviceAddress]map[uint64][]byte)
	}
	m := t.skipped[peer]
	if m == nil {
		m = make(map[uint64][]byte)
		t.skipped[peer] = m
	}
	m[seq] = v
}

func (t *deliveryTxn) clearSkipped(peer messages.DeviceAddress) {
	if t.skippedCleared == nil {
		t.skippedCleared = make(map[messages.DeviceAddress]bool)
	}
	t.skippedCleared[peer] = true
	delete(t.skipped, peer)
}

func (t *deliveryTxn) SkippedKeys(peer messages.DeviceAddress, fn func(seq uint64, entry []byte) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	// Collect first, so fn may write.
	seqs := t.skippedSeqs(peer)
	entries := make([][]byte, len(seqs))
	for i, seq := range seqs {
		v, _ := t.getSkipped(peer, seq)
		entries[i] = cloneBytes(v)
	}
	for i, seq := range seqs {
		if err := t.check(false); err != nil {
			return err
		}
		if cont, err := fn(seq, entries[i]); err != nil || !cont {
			return err
		}
	}
	return nil
}

func (t *deliveryTxn) SkippedKeyCount(peer *messages.DeviceAddress) (int, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	if peer != nil {
		if err := checkPeer(*peer); err != nil {
			return 0, err
		}
		return t.peerSkipped(*peer), nil
	}
	n := t.d.nSkipped
	for _, p := range t.touchedSkipped() {
		n += t.peerSkipped(p) - len(t.d.skipped[p])
	}
	return n, nil
}

// touchedSkipped lists the peers whose keys this transaction changed.
func (t *deliveryTxn) touchedSkipped() []messages.DeviceAddress {
	var out []messages.DeviceAddress
	for p := range t.skippedCleared {
		out = append(out, p)
	}
	for p := range t.skipped {
		if !t.skippedCleared[p] {
			out = append(out, p)
		}
	}
	return out
}

func (t *deliveryTxn) PutSkippedKey(peer messages.DeviceAddress, seq uint64, entry []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if len(entry) > persistence.MaxSkippedKeyEntry {
		return fmt.Errorf("memory: skipped key of %d bytes (at most %d): %w", len(entry), persistence.MaxSkippedKeyEntry, persistence.ErrInvalidRecord)
	}
	t.stageSkipped(peer, seq, append([]byte{}, entry...))
	return nil
}

func (t *deliveryTxn) DeleteSkippedKey(peer messages.DeviceAddress, seq uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if _, ok := t.getSkipped(peer, seq); ok {
		t.stageSkipped(peer, seq, nil)
	}
	return nil
}

func (t *deliveryTxn) EvictSkippedKeys(limit int) ([]persistence.SkippedEviction, error) {
	if err := t.check(true); err != nil {
		return nil, err
	}
	total, err := t.SkippedKeyCount(nil)
	if err != nil || total <= max(limit, 0) {
		return nil, err
	}
	peers := t.touchedSkipped()
	for p := range t.d.skipped {
		peers = append(peers, p)
	}
	slices.SortFunc(peers, messages.DeviceAddress.Compare)
	peers = slices.Compact(peers)
	var holders []persistence.SkippedHolder
	for _, p := range peers {
		if n := t.peerSkipped(p); n > 0 {
			holders = append(holders, persistence.SkippedHolder{Peer: p, Count: n})
		}
	}
	plan := persistence.PlanSkippedEviction(holders, limit)
	for _, e := range plan {
		for _, seq := range t.skippedSeqs(e.Peer)[:e.Count] {
			t.stageSkipped(e.Peer, seq, nil)
		}
	}
	return plan, nil
}

// commitSkipped applies the staged skipped-key writes (under the data's
// write lock).
func (t *deliveryTxn) commitSkipped() {
	d := t.d
	for p := range t.skippedCleared {
		d.nSkipped -= len(d.skipped[p])
		delete(d.skipped, p)
	}
	for p, staged := range t.skipped {
		m := d.skipped[p]
		for seq, v := range staged {
			_, had := m[seq]
			switch {
			case v == nil && had:
				delete(m, seq)
				d.nSkipped--
			case v != nil:
				if m == nil {
					m = make(map[uint64][]byte)
					d.skipped[p] = m
				}
				if !had {
					d.nSkipped++
				}
				m[seq] = v
			}
		}
		if len(m) == 0 {
			delete(d.skipped, p)
		}
	}
}
