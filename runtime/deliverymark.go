package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The delivery plane's restore mark. A device whose node.db is restored
// from an older copy (a backup, a VM snapshot, a copied file) holds
// ratchet sessions behind its peers': sending on them reuses chain
// positions the peers already consumed (envelope version 2 keeps that
// confidential, docs/protocol.md "Envelope version 2"; the receivers
// still refuse those envelopes as replays). The clock mark sees such a
// restore only when the sync plane moved its lease since the copy, so the
// delivery plane keeps its own: the store counts every session record
// write (persistence.DeliveryReader.SessionWrites, in the transaction
// that writes the record), and after each committed delivery transaction
// that moved the count this file beside node.db is set to it. Open
// compares the two: a store below its file (or a file missing or damaged
// beside a store that wrote sessions) is older than sessions the device
// already used, so the device opens as restored — it re-initiates each
// session before its first send and sends every pending message again
// (device.Config.Restored) — instead of waiting for its peers to refuse
// its envelopes and repair.
//
// The file is written after the commit and without an fsync (a 20-byte
// write in place: a syscall per delivery transaction, next to the
// transaction's own fsync): a crash can only leave it at or below the
// store, never above, so a crash is never taken for a restore. What the
// missing fsync costs is a power loss right after a restore's copy was
// taken; a damaged file (a torn write) counts as a restore, which only
// costs a re-initiation per peer.

const deliveryMarkName = "delivery.mark"

var deliveryMarkMagic = []byte("smdeliv1")

func encodeDeliveryMark(m uint64) []byte { return encodeMarkFile(deliveryMarkMagic, m) }

func decodeDeliveryMark(b []byte) (uint64, error) {
	return decodeMarkFile(deliveryMarkMagic, "delivery", b)
}

// The sent mark, delivery.sent beside node.db, is kept the same way
// for the sends the store accepted (persistence.DeliveryReader.
// OutboundSequence): a store below it lost the messages accepted in
// between, which Open reports (RestoreStatus.DeliveryLostSends) instead
// of forgetting them. A second file, so that delivery.mark keeps its
// format; missing (a node from before it) it reports nothing.
const deliverySentName = "delivery.sent"

var deliverySentMagic = []byte("smdsent1")

func encodeDeliverySent(m uint64) []byte { return encodeMarkFile(deliverySentMagic, m) }

func decodeDeliverySent(b []byte) (uint64, error) {
	return decodeMarkFile(deliverySentMagic, "delivery sent", b)
}

// deliveryMark is an open mark file (delivery.mark or delivery.sent).
type deliveryMark struct {
	mu     sync.Mutex
	f      *os.File
	last   uint64
	warned bool
	log    func(msg string, args ...any)
	enc    func(uint64) []byte
}

// advance sets the file to v when v is above what it holds.
func (m *deliveryMark) advance(v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.f == nil || v <= m.last {
		return
	}
	if _, err := m.f.WriteAt(m.enc(v), 0); err != nil {
		if !m.warned {
			m.warned = true
			m.log("delivery mark: write failed; a restore of node.db may go unnoticed until peers repair the sessions", "err", err)
		}
		return
	}
	m.last = v
}

func (m *deliveryMark) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.f == nil {
		return nil
	}
	err := m.f.Close()
	m.f = nil
	return err
}

// markedDelivery moves the delivery mark after each committed Update.
type markedDelivery struct {
	persistence.DeliveryStore
	mark, sent *deliveryMark
}

func (s markedDelivery) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	var writes, sent uint64
	err := s.DeliveryStore.Update(ctx, func(tx persistence.DeliveryTx) error {
		if err := fn(tx); err != nil {
			return err
		}
		var err error
		if writes, err = tx.SessionWrites(); err != nil {
			return err
		}
		sent, err = tx.OutboundSequence()
		return err
	})
	if err == nil {
		s.mark.advance(writes)
		s.sent.advance(sent)
	}
	return err
}

// restoreDetectedCounter counts restores found, by plane and evidence.
func (n *Node) restoreDetectedCounter() (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncmesh_restore_detected_total",
		Help: "Restores of this node's store found, by plane (delivery, sync) and evidence (mark: a mark kept beside node.db; peer: a peer holds newer events of this node)."},
		[]string{"plane", "evidence"})
	return promreg.Register(n.registerer, c)
}

// openDeliveryMark compares the delivery store's session write count
// with the mark file at Open (see above), brings the store up to the
// file when the file is ahead, and returns the store wrapped so that
// every commit moves the file. restored reports the verdict.
func (n *Node) openDeliveryMark(ctx context.Context, store persistence.DeliveryStore) (persistence.DeliveryStore, bool, error) {
	if !n.cfg.markFiles() {
		return store, false, nil
	}
	path := filepath.Join(n.cfg.Dir, deliveryMarkName)
	var fileMark uint64
	found, bad := true, false
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		found = false
	case err != nil:
		return nil, false, fmt.Errorf("runtime: read delivery mark: %w", err)
	default:
		if fileMark, err = decodeDeliveryMark(b); err != nil {
			bad = true
			n.log.Warn("delivery mark is damaged; treated as a restore (each session is re-initiated once)", "path", path, "err", err)
		}
	}
	var storeMark uint64
	if err := store.View(ctx, func(tx persistence.DeliveryReader) error {
		storeMark, err = tx.SessionWrites()
		return err
	}); err != nil {
		return nil, false, err
	}
	var reason string
	switch {
	case bad:
		reason = "delivery mark file damaged"
	case !found && storeMark > 0:
		reason = "delivery mark file missing beside a store with sessions"
	case fileMark > storeMark:
		reason = "node.db's delivery sessions are older than the delivery mark file (opened from a copy?)"
	}
	if fileMark > storeMark {
		// node.db catches up, so the next Open does not report it again.
		if err := store.Update(ctx, func(tx persistence.DeliveryTx) error { return tx.RaiseSessionWrites(fileMark) }); err != nil {
			return nil, false, fmt.Errorf("runtime: raise the delivery mark: %w", err)
		}
	}
	last := max(storeMark, fileMark)
	if err := writeFileAtomic(path, encodeDeliveryMark(last), n.cfg.NoSync); err != nil {
		return nil, false, fmt.Errorf("runtime: write delivery mark: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("runtime: open delivery mark: %w", err)
	}
	m := &deliveryMark{f: f, last: last, log: n.log.Warn, enc: encodeDeliveryMark}
	n.closers.push(m.close)
	sent, lost, err := n.openDeliverySent(ctx, store)
	if err != nil {
		return nil, false, err
	}
	restored := reason != ""
	n.restore.mu.Lock()
	n.restore.status.DeliverySuspected = restored
	n.restore.status.DeliveryReason = reason
	n.restore.status.DeliveryStoreMark, n.restore.status.DeliveryFileMark = storeMark, fileMark
	n.restore.status.DeliveryLostSends = lost
	n.restore.mu.Unlock()
	if lost > 0 {
		n.restore.lostSends.Add(float64(lost))
	}
	if restored {
		n.restore.detected.WithLabelValues("delivery", "mark").Inc()
		n.log.Warn("store looks restored on the delivery plane: every session is re-initiated before its next send and pending messages are sent again",
			"reason", reason, "store_mark", storeMark, "file_mark", fileMark, "lost_sends", lost)
		n.publish(messages.RestoreDetected{Plane: "delivery", Evidence: "mark",
			Detail: fmt.Sprintf("%s (store %d, file %d)", reason, storeMark, fileMark), LostSends: lost})
	} else if lost > 0 {
		// Only the sent mark moved since the copy (sends that wrote no
		// session record): still a restore, reported with what it lost.
		n.log.Warn("store looks restored on the delivery plane: sends accepted since its copy are gone", "lost_sends", lost)
		n.publish(messages.RestoreDetected{Plane: "delivery", Evidence: "mark",
			Detail: fmt.Sprintf("node.db holds fewer accepted sends than delivery.sent (%d lost)", lost), LostSends: lost})
	}
	return markedDelivery{DeliveryStore: store, mark: m, sent: sent}, restored, nil
}

// openDeliverySent compares the sends the store accepted with
// delivery.sent (see above): lost is how many the store no longer holds
// (0 when the file is missing or damaged: nothing to compare). The store
// is raised to the file, so the loss is reported once and no outbound
// sequence is assigned twice.
func (n *Node) openDeliverySent(ctx context.Context, store persistence.DeliveryStore) (*deliveryMark, uint64, error) {
	path := filepath.Join(n.cfg.Dir, deliverySentName)
	var fileSent uint64
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, 0, fmt.Errorf("runtime: read delivery sent mark: %w", err)
	default:
		if fileSent, err = decodeDeliverySent(b); err != nil {
			fileSent = 0
			n.log.Warn("delivery sent mark is damaged; sends a restore lost cannot be counted this time", "path", path, "err", err)
		}
	}
	var storeSent uint64
	if err := store.View(ctx, func(tx persistence.DeliveryReader) error {
		storeSent, err = tx.OutboundSequence()
		return err
	}); err != nil {
		return nil, 0, err
	}
	var lost uint64
	if fileSent > storeSent {
		lost = fileSent - storeSent
		if err := store.Update(ctx, func(tx persistence.DeliveryTx) error { return tx.RaiseOutboundSequence(fileSent) }); err != nil {
			return nil, 0, fmt.Errorf("runtime: raise the delivery sent mark: %w", err)
		}
	}
	last := max(storeSent, fileSent)
	if err := writeFileAtomic(path, encodeDeliverySent(last), n.cfg.NoSync); err != nil {
		return nil, 0, fmt.Errorf("runtime: write delivery sent mark: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("runtime: open delivery sent mark: %w", err)
	}
	m := &deliveryMark{f: f, last: last, log: n.log.Warn, enc: encodeDeliverySent}
	n.closers.push(m.close)
	return m, lost, nil
}
