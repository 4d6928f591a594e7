package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/apply"
	"github.com/syncmesh/syncmesh/actors/clock"
	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Restore safety (SSP/1 §13.5): a node must never issue an HLC it already
// released, also when node.db is an older copy and the wall clock is set
// back. A copy of node.db cannot be told from the original by looking at
// it, so the clock's high-water mark is kept twice: in node.db and in a
// small file beside it (clock.mark), written before any HLC of a new lease
// window is issued (one atomic file write per window, not per event). Open
// resumes above the higher of the two. A node.db restored alone is thus
// safe at once, writes included, and the Open looks like a restore (the
// file's mark is above node.db's): it is logged and reported by
// Node.RestoreStatus. A directory restored whole (the file too) is told
// by the operator (Config.Restored): local writes then wait until
// reconciliations with peers that hold this node's tables have applied its
// own released events (verified, signed by its key, within the skew bound
// — the apply chokepoint observes their HLCs, so the clock is past them;
// restoreReconciled says what counts as evidence), at most
// Config.RestoreWait, then fail with ErrAwaitingReconcile.

// DefaultRestoreWait bounds a local write's wait for the first
// reconciliation after a restore when Config.RestoreWait is zero.
const DefaultRestoreWait = 30 * time.Second

const (
	clockMarkName = "clock.mark"
	clockMarkSize = 8 + len(messages.SiteID{}) + 8 + 4
)

var clockMarkMagic = []byte("smclock1")

// RestoreStatus says whether this node's last Open looked like a restore
// and whether local writes are held for it.
type RestoreStatus struct {
	// Suspected: node.db's clock mark was below the clock mark file's, or
	// the file was missing beside an existing store (a restore of node.db
	// alone, an upgrade from a version without the file, or a deleted
	// file). The node resumed above the higher mark either way.
	Suspected bool
	// Reason says why, for logs and operators.
	Reason string
	// StoreMark and FileMark are the two marks read at Open (0: none).
	StoreMark, FileMark messages.HLC
	// Held: Config.Restored is set and reconciliations since Open have
	// not yet given the evidence to release local writes (see
	// Config.Restored); they wait for it.
	Held bool
	// LogRotated: the Open gave the log a new id (a suspected restore or
	// Config.Restored), so peers take this node's log as new and its
	// cursors toward them start at genesis.
	LogRotated bool
	// DeliverySuspected: the delivery plane's mark (delivery.mark beside
	// node.db, deliverymark.go) says the store's sessions are older than
	// sessions this device already used (a restore of node.db), or the
	// file was missing beside a store that wrote sessions, or damaged.
	// The device then re-initiated each session before its first send.
	// DeliveryReason says why; DeliveryStoreMark and DeliveryFileMark are
	// the store's session write count and the file's, read at Open.
	DeliverySuspected bool
	DeliveryReason    string
	DeliveryStoreMark uint64
	DeliveryFileMark  uint64
	// DeliveryLostSends: how many messages the device accepted for
	// sending (Send) that the store opened no longer holds — sends a
	// rolled-back node.db lost (delivery.sent beside node.db counts the
	// sends the store accepted; 0 when the file is missing). Their ACKs,
	// when they come, are SentMessageLost notices naming each id.
	DeliveryLostSends uint64
}

// restoreState is the node's restore bookkeeping.
type restoreState struct {
	mu     sync.Mutex
	status RestoreStatus
	held   prometheus.Gauge
	// compared: synced tables a peer answered and held events in, since
	// Open (restoreReconciled); bounded by the synced tables.
	compared map[reconcile.Group]bool
	// floor is the clock's floor at Open (the higher mark); evident is
	// set once peers' events gave evidence of a restore (noteOwnEvents).
	floor   messages.HLC
	evident bool
	// device is the node's device once it is open (nil before, and
	// without one): noteOwnEvents tells it; openDevice tells it of
	// evidence found before it opened.
	device *device.Device
	// detected counts restores found (syncmesh_restore_detected_total).
	detected *prometheus.CounterVec
	// lostSends counts the sends restores lost
	// (syncmesh_delivery_lost_sends_total, deliverymark.go).
	lostSends prometheus.Counter
}

// RestoreStatus reports the restore check of the last Open.
func (n *Node) RestoreStatus() RestoreStatus {
	n.restore.mu.Lock()
	st := n.restore.status
	n.restore.mu.Unlock()
	select {
	case <-n.clock.Released():
		st.Held = false
	default:
		st.Held = true
	}
	return st
}

func (n *Node) clockMarkPath() string { return filepath.Join(n.cfg.Dir, clockMarkName) }

// openClock builds the node's clock above the higher of node.db's mark
// (storeMark) and the clock mark file's, records whether the Open looks
// like a restore, and holds the clock when Config.Restored says so.
func (n *Node) openClock(ctx context.Context, storeMark messages.HLC) (*clock.Clock, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "syncmesh_restore_writes_held_since_timestamp_seconds",
		Help: "When local writes began to wait for the first reconciliation after an Open with Config.Restored (Unix seconds); 0 when they do not wait."})
	g, err := promreg.Register(n.registerer, g)
	if err != nil {
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	n.restore.held = g
	if n.restore.detected, err = n.restoreDetectedCounter(); err != nil { // deliverymark.go
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	lost := prometheus.NewCounter(prometheus.CounterOpts{Name: "syncmesh_delivery_lost_sends_total",
		Help: "Messages accepted for sending that a restored node.db no longer holds (delivery.sent above the store at Open); their ACKs are SentMessageLost notices."})
	if n.restore.lostSends, err = promreg.Register(n.registerer, lost); err != nil {
		return nil, fmt.Errorf("runtime: metrics: %w", err)
	}
	st := RestoreStatus{StoreMark: storeMark}
	floor := storeMark
	if n.cfg.markFiles() {
		mark, found, err := readClockMark(n.clockMarkPath(), n.signer.Site())
		if err != nil {
			return nil, err
		}
		st.FileMark = mark
		switch {
		case !found && storeMark > 0:
			st.Suspected, st.Reason = true, "clock mark file missing beside an existing store"
		case mark > storeMark:
			st.Suspected, st.Reason = true, "node.db is older than its clock mark file (opened from a copy?)"
		}
		floor = max(floor, mark)
		if !found || mark < floor {
			if err := n.writeClockMark(floor); err != nil {
				return nil, err
			}
		}
		if storeMark < floor {
			// node.db catches up, so the next Open does not warn again.
			if err := n.persistHighWater(floor); err != nil {
				return nil, fmt.Errorf("runtime: persist clock mark: %w", err)
			}
		}
	}
	if st.Suspected {
		n.log.Warn("store looks restored: the clock resumes above the clock mark file; reconcile with peers to take back this node's events",
			"reason", st.Reason, "store_mark", storeMark, "file_mark", st.FileMark)
	}
	evident, err := n.restoreEvidentMark(ctx)
	if err != nil {
		return nil, err
	}
	if evident && !st.Suspected {
		// The last run found a peer holding this node's events that its
		// store lacked (noteOwnEvents): this Open completes the recovery
		// a running node cannot do, a new log id (rotateLogAfterRestore).
		st.Suspected, st.Reason = true, "a peer held events of this node that its store lacked (found in the last run)"
		n.log.Warn("store was found restored in the last run: the log gets a new id", "reason", st.Reason)
	}
	n.restore.mu.Lock()
	n.restore.status = st
	n.restore.floor = floor
	n.restore.mu.Unlock()
	c := clock.New(n.cfg.Wall, floor, n.persistMarks, clock.DefaultLease)
	if err := n.watchClockBehind(c, floor); err != nil {
		return nil, err
	}
	if n.cfg.Restored {
		c.Hold()
		g.SetToCurrentTime()
		n.log.Warn("Config.Restored: local writes wait for reconciliations with peers holding this node's tables")
	}
	return c, nil
}

// skewBound is SSP/1 §12's clock-skew bound as a duration.
const skewBound = apply.MaxSkewMS * time.Millisecond

// clockBehind returns how far the wall clock is behind the HLC clock's
// last value (0 when it is not): past skewBound, every local write is
// refused as clock skew (its HLC, above the mark, is further ahead of the
// wall clock than SSP/1 §12 allows) until the wall clock catches up.
func clockBehind(c *clock.Clock) time.Duration {
	last, wall := c.Last().Physical(), c.WallMS()
	if last <= wall {
		return 0
	}
	return time.Duration(last-wall) * time.Millisecond
}

// watchClockBehind makes a wall clock behind the clock mark loud: Open
// logs a warning that says for how long local writes will be refused, a
// gauge reports the lag, and the health check fails while it exceeds the
// skew bound. The delivery plane does not use this clock: message
// retries and delivery go on.
func (n *Node) watchClockBehind(c *clock.Clock, mark messages.HLC) error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "syncmesh_clock_behind_mark_seconds",
		Help: "How far the wall clock is behind the node's HLC clock (its clock mark or the last HLC issued or observed), in seconds; past the skew bound (300 s) local writes are refused as clock skew."},
		func() float64 { return clockBehind(c).Seconds() })
	if _, err := promreg.Register(n.registerer, g); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	if behind := clockBehind(c); behind > skewBound {
		refused := behind - skewBound
		n.log.Warn("wall clock is behind the clock mark by more than the skew bound: local writes are refused as clock skew until it catches up; received events from peers with correct clocks are rejected as skewed too; message delivery is not affected",
			"behind", behind, "skew_bound", skewBound, "writes_refused_for", refused,
			"until", n.cfg.Wall().Add(refused).UTC(), "clock_mark", mark)
	}
	return nil
}

// clockHealth reports a wall clock behind the HLC clock by more than the
// skew bound (the health check's 503), or nil.
func (n *Node) clockHealth() error {
	if n.clock == nil {
		return nil
	}
	if behind := clockBehind(n.clock); behind > skewBound {
		return fmt.Errorf("%w: the wall clock is %v behind the clock mark (skew bound %v): local writes are refused for about %v more",
			ErrClockBehind, behind.Round(time.Second), skewBound, (behind - skewBound).Round(time.Second))
	}
	return nil
}

// persistMarks is the clock's persist: node.db first, then the file, so a
// crash between leaves node.db at or above the file (not a restore's
// signature), and no HLC is issued above either before both are durable.
func (n *Node) persistMarks(h messages.HLC) error {
	if err := n.persistHighWater(h); err != nil {
		return err
	}
	if !n.cfg.markFiles() {
		return nil
	}
	return n.writeClockMark(h)
}

// closeClockMarks stops the clock at a clean close (everything that
// issues HLCs has stopped by then; the store is still open) and lowers
// both marks from the leased high-water to the highest HLC issued or
// observed, so the next Open resumes there instead of a lease ahead of it:
// otherwise every restart would push the clock a lease further ahead of
// the wall clock, and a node restarted often enough refuses its own
// writes as clock skew (SSP/1 §12 step 2) with a correct wall clock. No
// HLC above the lowered mark was released (SSP/1 §13.5). The file is
// written first: a crash between leaves node.db at or above it, which is
// not a restore's signature. A failure keeps the higher marks, which are
// safe, and is logged.
func (n *Node) closeClockMarks() error {
	h := n.clock.Stop()
	var err error
	if n.cfg.markFiles() {
		err = n.writeClockMark(h)
	}
	if err == nil {
		err = n.persistHighWater(h)
	}
	if err != nil {
		n.log.Warn("close: lowering the clock marks to the last HLC failed; the next Open resumes up to a lease ahead", "hlc", h, "err", err)
	}
	return nil
}

// restoreReconciled runs after a reconciliation this node started. A
// held clock is released only by evidence (SSP/1 §13.5: an HLC once
// released must never be issued again): a completed session (not
// truncated) in which the peer answered a group — it syncs the table and
// compared it, so what it holds there was applied and its HLCs observed —
// and held events in it. A group the peer left out of its answers (it
// does not sync the table: an empty new node, a hostile one) and a group
// the peer holds nothing of say nothing: silence is never agreement.
// Evidence accumulates over sessions and peers; the hold is released once
// every synced table that holds this node's own events (its own
// watermark) was so compared — or, when the copy holds none of its own
// events, once any synced table was. Node.ReleaseRestoreHold is the
// operator's explicit way out.
func (n *Node) restoreReconciled(ctx context.Context, rep ReconcileReport, ev []groupEvidence, err error) {
	if err != nil || rep.Truncated {
		return
	}
	select {
	case <-n.clock.Released():
		return
	default:
	}
	n.restore.mu.Lock()
	if n.restore.compared == nil {
		n.restore.compared = map[reconcile.Group]bool{}
	}
	for _, e := range ev {
		if e.peerCount > 0 {
			n.restore.compared[e.group] = true
		}
	}
	compared := maps.Clone(n.restore.compared)
	n.restore.mu.Unlock()
	required, err := n.ownGroups(ctx)
	if err != nil {
		n.log.Warn("restore: reading this node's own groups failed; writes stay held", "err", err)
		return
	}
	var missing []string
	for _, g := range required {
		if !compared[g] {
			missing = append(missing, g.String())
		}
	}
	if len(missing) > 0 || len(compared) == 0 {
		n.log.Info("restore: a reconciliation completed without the evidence to release local writes", "peer", rep.Peer,
			"tables_not_compared", missing, "tables_compared", len(compared))
		return
	}
	n.releaseHold("restore: reconciled with peers holding this node's tables; local writes resume", "peer", rep.Peer)
}

// ownGroups lists the synced tables in which this node holds its own
// events (an own watermark, SSP/1 §14.2).
func (n *Node) ownGroups(ctx context.Context) ([]reconcile.Group, error) {
	groups, err := n.syncedGroups(ctx)
	if err != nil {
		return nil, err
	}
	site := n.signer.Site()
	var out []reconcile.Group
	err = n.store.View(ctx, func(tx persistence.SyncReader) error {
		for _, g := range groups {
			_, ok, err := tx.Watermark(persistence.GroupKey{Site: site, Schema: g.Schema, Table: g.Table})
			if err != nil {
				return err
			}
			if ok {
				out = append(out, g)
			}
		}
		return nil
	})
	return out, err
}

// releaseHold releases a held clock (once) and logs why.
func (n *Node) releaseHold(msg string, args ...any) {
	n.restore.mu.Lock()
	defer n.restore.mu.Unlock()
	select {
	case <-n.clock.Released():
		return
	default:
	}
	n.clock.Release()
	n.restore.held.Set(0)
	n.log.Info(msg, append(args, "clock", n.clock.Last())...)
}

// ReleaseRestoreHold releases the hold of Config.Restored without the
// evidence a reconciliation gives: local writes resume at once. It is the
// operator's decision that no HLC this node released before the restore
// can be issued again — for example because the copy is known to be
// current, or because every peer that could hold this node's events is
// gone. Used wrongly, the node may issue an HLC twice (SSP/1 §13.5) and a
// write may lose to an older one. Logged as a warning; a no-op when
// nothing is held.
func (n *Node) ReleaseRestoreHold() {
	select {
	case <-n.clock.Released():
		return
	default:
	}
	n.log.Warn("restore: local writes released by the operator without a reconciliation's evidence")
	n.releaseHold("restore: hold released by the operator")
}

// awaitClock waits, for a local write, until the clock is not held (see
// Config.Restored), at most Config.RestoreWait.
func (n *Node) awaitClock(ctx context.Context) error {
	rel := n.clock.Released()
	select {
	case <-rel:
		return nil
	default:
	}
	wait := n.cfg.RestoreWait
	if wait == 0 {
		wait = DefaultRestoreWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-rel:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.closed:
		return ErrClosed
	case <-t.C:
		return fmt.Errorf("%w: no reconciliation with a peer completed within %v of waiting", ErrAwaitingReconcile, wait)
	}
}

// readClockMark reads the clock mark file. A missing file is (0, false);
// a file of another site is treated as missing (it says nothing about
// this node); anything else malformed is ErrClockMark.
func readClockMark(path string, site messages.SiteID) (messages.HLC, bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("%w: %s: %v", ErrClockMark, path, err)
	}
	h, s, err := decodeClockMark(b)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %s: %v", ErrClockMark, path, err)
	}
	if s != site {
		return 0, false, nil
	}
	return h, true, nil
}

func encodeClockMark(h messages.HLC, site messages.SiteID) []byte {
	b := make([]byte, 0, clockMarkSize)
	b = append(b, clockMarkMagic...)
	b = append(b, site[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(h))
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func decodeClockMark(b []byte) (messages.HLC, messages.SiteID, error) {
	var site messages.SiteID
	if len(b) != clockMarkSize {
		return 0, site, fmt.Errorf("%d bytes, want %d", len(b), clockMarkSize)
	}
	if !bytes.Equal(b[:len(clockMarkMagic)], clockMarkMagic) {
		return 0, site, fmt.Errorf("not a clock mark file")
	}
	body := b[:clockMarkSize-4]
	if crc32.ChecksumIEEE(body) != binary.BigEndian.Uint32(b[clockMarkSize-4:]) {
		return 0, site, fmt.Errorf("checksum mismatch")
	}
	copy(site[:], b[len(clockMarkMagic):])
	return messages.HLC(binary.BigEndian.Uint64(body[len(body)-8:])), site, nil
}

// writeClockMark replaces the clock mark file atomically (temporary file,
// fsync, rename, fsync of the directory; no fsync with Config.NoSync).
func (n *Node) writeClockMark(h messages.HLC) error {
	path := n.clockMarkPath()
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("runtime: write clock mark: %w", err)
	}
	_, err = f.Write(encodeClockMark(h, n.signer.Site()))
	if err == nil && !n.cfg.NoSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && !n.cfg.NoSync {
		err = syncDir(n.cfg.Dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("runtime: write clock mark: %w", err)
	}
	return nil
}

// metaCursorEpoch names the senders' cursor epoch (replicate.Deps.CursorEpoch).
const metaCursorEpoch = "cursor_epoch"

// rotateLogAfterRestore gives the log a new id when the Open looked like a
// restore or Config.Restored says it is one. A restored copy reuses the
// log sequences its lost part had assigned, to other events; under the
// old id a peer keeps its progress in that log, so a gap it recorded there
// is never offered again and its watermarks of this node stop rising.
// Under a new id every peer starts this log afresh (its progress, gaps
// and pending ranges are of the old log), and this node's cursors toward
// its peers start at genesis (a new cursor epoch): the whole log is
// offered once more, less what each peer's watermarks show it applied.
func (n *Node) rotateLogAfterRestore(ctx context.Context) error {
	n.restore.mu.Lock()
	restored := n.restore.status.Suspected || n.cfg.Restored
	n.restore.mu.Unlock()
	if !restored {
		return nil
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	if err := n.store.Update(ctx, func(tx persistence.SyncTx) error {
		if err := tx.PutMeta(metaLogID, id); err != nil {
			return err
		}
		if err := tx.PutMeta(metaRestoreEvident, []byte{}); err != nil {
			return err
		}
		return tx.PutMeta(metaCursorEpoch, []byte(hex.EncodeToString(id)))
	}); err != nil {
		return fmt.Errorf("runtime: rotate the log id: %w", err)
	}
	n.restore.mu.Lock()
	n.restore.status.LogRotated = true
	n.restore.mu.Unlock()
	n.log.Warn("restore: the log has a new id; peers take it as new and it is offered to them from the start", "log", hex.EncodeToString(id))
	return nil
}

// loadCursorEpoch reads the cursor epoch ("" until a log was rotated).
func (n *Node) loadCursorEpoch(ctx context.Context) (string, error) {
	var epoch string
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		v, _, err := tx.Meta(metaCursorEpoch)
		epoch = string(v)
		return err
	})
	return epoch, err
}

// metaRestoreEvident is set (non-empty) when a running node found a peer
// holding its own events that its store lacked (noteOwnEvents); the next
// Open treats itself as a restore (a new log id) and clears it.
const metaRestoreEvident = "restore_evident"

func (n *Node) restoreEvidentMark(ctx context.Context) (bool, error) {
	var set bool
	err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		v, ok, err := tx.Meta(metaRestoreEvident)
		set = ok && len(v) > 0
		return err
	})
	return set, err
}

// noteOwnEvents looks at the outcomes of events received from peers (a
// push, a reconciliation's fetch, ApplySigned) for evidence that this
// node's store is an older copy restored as a whole directory — the
// clock mark and changes.mark with it, so no mark could tell at Open.
// An event signed by this node that is new to its store (applied or
// held, not a duplicate) is such evidence: every event this run signed
// was stored before any peer could hold it, so a peer can only return
// one the store lost. SSP/1 §13.5: the chokepoint already observed its
// HLC, so the clock issues above it from now on; this reports it
// (RestoreStatus.Suspected, a RestoreDetected notice,
// syncmesh_restore_detected_total{plane="sync",evidence="peer"}, a WARN
// log), tells the device its sessions may be behind its peers'
// (re-initiation before the next send, pending messages sent again), and
// leaves a mark in node.db so that the next Open gives the log a new id.
// A node already known to be restored (a suspected Open, or
// Config.Restored) expects its own events back and reports nothing.
func (n *Node) noteOwnEvents(outs []messages.Outcome) {
	self := n.signer.Site()
	var hit *messages.Outcome
	for i := range outs {
		o := &outs[i]
		if o.Site == self && (o.Kind == messages.Applied || o.Kind == messages.Held) {
			hit = o
			break
		}
	}
	if hit == nil {
		return
	}
	n.restore.mu.Lock()
	if n.restore.evident || n.restore.status.Suspected || n.cfg.Restored {
		n.restore.mu.Unlock()
		return
	}
	n.restore.evident = true
	floor := n.restore.floor
	n.restore.status.Suspected = true
	n.restore.status.Reason = "a peer holds events of this node that its store lacks (restored as a whole directory?)"
	n.restore.mu.Unlock()
	above := hit.HLC > floor
	n.log.Warn("store found restored: a peer holds events of this node that its store lacks; the clock is past them, sessions are re-initiated, and the next Open gives the log a new id",
		"event_hlc", hit.HLC, "clock_floor_at_open", floor, "above_floor", above, "table", hit.Schema+"."+hit.Table)
	n.restore.detected.WithLabelValues("sync", "peer").Inc()
	n.publish(messages.RestoreDetected{Plane: "sync", Evidence: "peer",
		Detail: fmt.Sprintf("own event %s.%s at HLC %d received from a peer (clock floor at Open %d)", hit.Schema, hit.Table, hit.HLC, floor)})
	if err := n.store.Update(context.Background(), func(tx persistence.SyncTx) error {
		return tx.PutMeta(metaRestoreEvident, []byte{1})
	}); err != nil {
		n.log.Warn("restore: recording the evidence for the next Open failed", "err", err)
	}
	n.restore.mu.Lock()
	dev := n.restore.device
	n.restore.mu.Unlock()
	if dev != nil {
		dev.MarkRestored()
	}
}

// applyReceived is the chokepoint's ApplyBatch for events received from
// peers, looked at by noteOwnEvents.
func (n *Node) applyReceived(ctx context.Context, raws [][]byte) ([]messages.Outcome, error) {
	outs, err := n.apply.ApplyBatch(ctx, raws)
	if err == nil {
		n.noteOwnEvents(outs)
	}
	return outs, err
}

// applyReceivedWith is applyReceived for ApplyWith.
func (n *Node) applyReceivedWith(ctx context.Context, raws [][]byte, record func(tx persistence.SyncTx, outs []messages.Outcome) (func(), error)) ([]messages.Outcome, error) {
	outs, err := n.apply.ApplyWith(ctx, raws, record)
	if err == nil {
		n.noteOwnEvents(outs)
	}
	return outs, err
}
