package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// deliveryData is the committed delivery-plane state shared by every handle
// opened over it (ReopenDelivery).
type deliveryData struct {
	wmu sync.Mutex   // one Update at a time
	mu  sync.RWMutex // guards the fields below: Views hold R, commits hold W

	identity []byte
	prekeys  []byte
	sessions map[messages.DeviceAddress][]byte
	pins     map[messages.DeviceAddress]messages.IdentityKey
	in       *inboundState                                // commit-boundary records (inbound.go); replaced, never mutated
	skipped  map[messages.DeviceAddress]map[uint64][]byte // skipped keys (skipped.go)
	nSkipped int                                          // all peers' skipped keys
	// sessionWrites is persistence.DeliveryReader.SessionWrites.
	sessionWrites uint64
}

// DeliveryStore is an in-memory persistence.DeliveryStore, without
// encryption. An Update stages its writes in a write set and applies them
// on success only, so a failed Update leaves nothing behind; its cost does
// not grow with the number of stored sessions.
type DeliveryStore struct {
	d      *deliveryData
	closed atomic.Bool
}

var _ persistence.DeliveryStore = (*DeliveryStore)(nil)

// NewDelivery returns an empty delivery store.
func NewDelivery() *DeliveryStore {
	return &DeliveryStore{d: &deliveryData{
		sessions: make(map[messages.DeviceAddress][]byte),
		pins:     make(map[messages.DeviceAddress]messages.IdentityKey),
		in:       newInboundState(),
		skipped:  make(map[messages.DeviceAddress]map[uint64][]byte),
	}}
}

// Reopen returns a new open handle over the same committed data, as a
// restart would see it. s may be closed.
func (s *DeliveryStore) Reopen() *DeliveryStore { return &DeliveryStore{d: s.d} }

// Close marks the handle closed; later calls on it return
// persistence.ErrClosed. The data stays reachable through Reopen. Close
// is idempotent (a second call returns nil).
func (s *DeliveryStore) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *DeliveryStore) check(ctx context.Context, op string) error {
	if s.closed.Load() {
		return fmt.Errorf("memory: delivery %s: %w", op, persistence.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: delivery %s: %w", op, err)
	}
	return nil
}

// Update runs fn in one atomic transaction (see persistence.DeliveryStore).
func (s *DeliveryStore) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	if err := s.check(ctx, "update"); err != nil {
		return err
	}
	s.d.wmu.Lock()
	defer s.d.wmu.Unlock()
	if s.closed.Load() {
		return fmt.Errorf("memory: delivery update: %w", persistence.ErrClosed)
	}
	// Only this goroutine commits, so fn reads the committed maps without mu.
	tx := &deliveryTxn{d: s.d, write: true}
	err := fn(tx)
	tx.done = true
	if err != nil {
		return err
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if tx.identity != nil {
		s.d.identity = tx.identity
	}
	if tx.prekeys != nil {
		s.d.prekeys = tx.prekeys
	}
	for a, v := range tx.sessions {
		if v == nil {
			delete(s.d.sessions, a)
		} else {
			s.d.sessions[a] = v
		}
	}
	for a, k := range tx.pins {
		s.d.pins[a] = k
	}
	tx.commitSkipped()
	if tx.sessionWrites > s.d.sessionWrites {
		s.d.sessionWrites = tx.sessionWrites
	}
	if tx.in != nil {
		s.d.in = tx.in
	}
	return nil
}

// View runs fn over the committed state; commits wait until fn returns.
func (s *DeliveryStore) View(ctx context.Context, fn func(tx persistence.DeliveryReader) error) error {
	if err := s.check(ctx, "view"); err != nil {
		return err
	}
	s.d.mu.RLock()
	defer s.d.mu.RUnlock()
	tx := &deliveryTxn{d: s.d}
	err := fn(tx)
	tx.done = true
	return err
}

// deliveryTxn implements persistence.DeliveryTx. Writes go to the write
// set (a nil session value marks a deletion).
type deliveryTxn struct {
	d     *deliveryData
	write bool
	done  bool

	identity, prekeys []byte
	sessions          map[messages.DeviceAddress][]byte
	pins              map[messages.DeviceAddress]messages.IdentityKey
	in                *inboundState // staged commit-boundary records (nil: unchanged)
	// skipped stages skipped-key writes (a nil entry: deleted);
	// skippedCleared marks peers whose committed keys are all deleted.
	skipped        map[messages.DeviceAddress]map[uint64][]byte
	skippedCleared map[messages.DeviceAddress]bool
	// sessionWrites is the staged SessionWrites (0: unchanged).
	sessionWrites uint64
}

var errDeliveryReadOnly = errors.New("memory: write in a read-only delivery transaction")

func (t *deliveryTxn) check(write bool) error {
	if t.done {
		return errTxDone
	}
	if write && !t.write {
		return errDeliveryReadOnly
	}
	return nil
}

func checkPeer(peer messages.DeviceAddress) error {
	if err := peer.Validate(); err != nil {
		return fmt.Errorf("memory: delivery: %w", err)
	}
	return nil
}

func (t *deliveryTxn) LocalIdentity() ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	v := t.identity
	if v == nil {
		v = t.d.identity
	}
	return cloneBytes(v), v != nil, nil
}

func (t *deliveryTxn) Prekeys() ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	v := t.prekeys
	if v == nil {
		v = t.d.prekeys
	}
	return cloneBytes(v), v != nil, nil
}

func (t *deliveryTxn) Session(peer messages.DeviceAddress) ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	if err := checkPeer(peer); err != nil {
		return nil, false, err
	}
	if v, staged := t.sessions[peer]; staged {
		return cloneBytes(v), v != nil, nil
	}
	v, ok := t.d.sessions[peer]
	return cloneBytes(v), ok, nil
}

func (t *deliveryTxn) Pin(peer messages.DeviceAddress) (messages.IdentityKey, bool, error) {
	if err := t.check(false); err != nil {
		return messages.IdentityKey{}, false, err
	}
	if err := checkPeer(peer); err != nil {
		return messages.IdentityKey{}, false, err
	}
	if k, ok := t.pins[peer]; ok {
		return k, true, nil
	}
	k, ok := t.d.pins[peer]
	return k, ok, nil
}

func (t *deliveryTxn) Sessions(after *messages.DeviceAddress, fn func(messages.DeviceAddress) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	// Collect first, so fn may write.
	peers := make([]messages.DeviceAddress, 0, len(t.d.sessions)+len(t.sessions))
	for a := range t.d.sessions {
		if _, staged := t.sessions[a]; !staged {
			peers = append(peers, a)
		}
	}
	for a, v := range t.sessions {
		if v != nil {
			peers = append(peers, a)
		}
	}
	slices.SortFunc(peers, messages.DeviceAddress.Compare)
	for _, a := range peers {
		if after != nil && a.Compare(*after) <= 0 {
			continue
		}
		if err := t.check(false); err != nil {
			return err
		}
		cont, err := fn(a)
		if err != nil || !cont {
			return err
		}
	}
	return nil
}

func (t *deliveryTxn) PutLocalIdentity(identity []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	t.identity = append([]byte{}, identity...)
	return nil
}

func (t *deliveryTxn) PutPrekeys(prekeys []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	t.prekeys = append([]byte{}, prekeys...)
	return nil
}

func (t *deliveryTxn) PutSession(peer messages.DeviceAddress, record []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if t.sessions == nil {
		t.sessions = make(map[messages.DeviceAddress][]byte)
	}
	t.sessions[peer] = append([]byte{}, record...)
	t.sessionWrites = t.writes() + 1
	return nil
}

// writes is SessionWrites as this transaction sees it.
func (t *deliveryTxn) writes() uint64 { return max(t.sessionWrites, t.d.sessionWrites) }

func (t *deliveryTxn) SessionWrites() (uint64, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.writes(), nil
}

func (t *deliveryTxn) RaiseSessionWrites(floor uint64) error {
	if err := t.check(true); err != nil {
		return err
	}
	if floor > t.writes() {
		t.sessionWrites = floor
	}
	return nil
}

func (t *deliveryTxn) DeleteSession(peer messages.DeviceAddress) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if t.sessions == nil {
		t.sessions = make(map[messages.DeviceAddress][]byte)
	}
	t.sessions[peer] = nil
	t.sessionWrites = t.writes() + 1
	t.clearSkipped(peer)
	return nil
}

func (t *deliveryTxn) PutPin(peer messages.DeviceAddress, identity messages.IdentityKey) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	if t.pins == nil {
		t.pins = make(map[messages.DeviceAddress]messages.IdentityKey)
	}
	t.pins[peer] = identity
	return nil
}
