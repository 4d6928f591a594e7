package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// Failpoints of the delivery store (see Options.Failpoint).
const (
	// FailpointDeliveryUpdateBeforeCommit runs inside a delivery Update
	// after fn succeeded, before the commit; an error aborts it.
	FailpointDeliveryUpdateBeforeCommit = "delivery.update.before_commit"
	// FailpointDeliveryUpdateAfterCommit runs after a delivery Update
	// committed durably, before Update returns.
	FailpointDeliveryUpdateAfterCommit = "delivery.update.after_commit"
)

// Delivery-plane buckets. Names are part of the storage format.
var (
	bucketDeliveryMeta     = []byte("delivery.meta")     // "identity" | "prekeys" → sealed value
	bucketDeliverySessions = []byte("delivery.sessions") // addrKey → sealed session record
	bucketDeliveryPins     = []byte("delivery.pins")     // addrKey → sealed RecordPin: identity (64: sign || dh); layouts ≤ 10: plaintext
)

var (
	deliveryKeyIdentity = []byte("identity")
	deliveryKeyPrekeys  = []byte("prekeys")
)

// deliveryBuckets lists the delivery buckets.
func deliveryBuckets() [][]byte {
	return [][]byte{bucketDeliveryMeta, bucketDeliverySessions, bucketDeliveryPins}
}

// createDeliveryV1 creates the delivery buckets (the layout migration
// that adds the delivery plane; see migrations in layout.go).
func createDeliveryV1(tx *wtx) error {
	for _, name := range deliveryBuckets() {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// addrKey encodes a device address so that byte order is
// messages.DeviceAddress.Compare order: the user bytes with 0x00 escaped as
// 0x00 0xFF, a 0x00 0x01 terminator, then the device as 4 big-endian bytes.
func addrKey(a messages.DeviceAddress) []byte {
	return appendAddrKey(make([]byte, 0, addrKeyLen(a)), a)
}

// addrKeyLen is the length of addrKey(a).
func addrKeyLen(a messages.DeviceAddress) int {
	n := len(a.User) + 6
	for i := 0; i < len(a.User); i++ {
		if a.User[i] == 0 {
			n++
		}
	}
	return n
}

// appendAddrKey appends addrKey(a) to b.
func appendAddrKey(b []byte, a messages.DeviceAddress) []byte {
	for i := 0; i < len(a.User); i++ {
		c := a.User[i]
		b = append(b, c)
		if c == 0 {
			b = append(b, 0xFF)
		}
	}
	b = append(b, 0, 1)
	return binary.BigEndian.AppendUint32(b, a.Device)
}

// parseAddrKey reverses addrKey.
func parseAddrKey(k []byte) (messages.DeviceAddress, error) {
	var user []byte
	for i := 0; i < len(k); i++ {
		if k[i] != 0 {
			user = append(user, k[i])
			continue
		}
		if i+1 >= len(k) {
			break
		}
		switch k[i+1] {
		case 0xFF:
			user = append(user, 0)
			i++
			continue
		case 1:
			rest := k[i+2:]
			if len(rest) != 4 {
				return messages.DeviceAddress{}, fmt.Errorf("address key device of %d bytes: %w", len(rest), persistence.ErrCorrupt)
			}
			a := messages.DeviceAddress{User: string(user), Device: binary.BigEndian.Uint32(rest)}
			if err := a.Validate(); err != nil {
				return a, fmt.Errorf("address key: %w: %w", persistence.ErrCorrupt, err)
			}
			return a, nil
		}
		break
	}
	return messages.DeviceAddress{}, fmt.Errorf("malformed address key: %w", persistence.ErrCorrupt)
}

// sessionIdentity is the sealed row identity of peer's session record.
func sessionIdentity(peer messages.DeviceAddress) []byte {
	return sealed.SessionIdentity([]byte(peer.User), binary.BigEndian.AppendUint32(nil, peer.Device))
}

// pinIdentity is the sealed row identity of peer's pin: the address is in
// the associated data, so a pin copied to another device's row fails to
// open (a writer of the file without the storage key cannot move it).
func pinIdentity(peer messages.DeviceAddress) []byte {
	return sealed.PinIdentity([]byte(peer.User), binary.BigEndian.AppendUint32(nil, peer.Device))
}

// Delivery returns the delivery-plane store over the file. Closing the
// returned store closes only that handle; DB.Close releases the file.
func (d *DB) Delivery() persistence.DeliveryStore {
	return &deliveryStore{handle{d: d, plane: "delivery"}}
}

type deliveryStore struct{ handle }

// Update runs fn in one bbolt read-write transaction.
func (s *deliveryStore) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	if err := s.check(ctx, "update"); err != nil {
		return err
	}
	err := s.d.update(ctx, func(btx *wtx) error {
		tx, err := newDeliveryTx(s.d, btx)
		if err != nil {
			return err
		}
		defer func() { tx.done = true }()
		btx.OnCommit(func() { s.d.deliveryWrites.add(btx.Stats()) })
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.flushSkipped(); err != nil {
			return err
		}
		if err := tx.flushCounters(); err != nil {
			return err
		}
		return s.d.failpoint(FailpointDeliveryUpdateBeforeCommit)
	})
	if err != nil {
		return mapErr("delivery update", err)
	}
	s.d.deliveryCommits.Add(1)
	return s.d.failpoint(FailpointDeliveryUpdateAfterCommit)
}

// WriteStats counts what the committed read-write transactions of one
// plane wrote to the file. Each commit writes its dirty pages, then the
// meta page, with an fdatasync after each: the pages are what a commit
// costs beyond its two syncs, so benchmarks divide them by Commits.
type WriteStats struct {
	// Commits counts the committed transactions.
	Commits uint64
	// Pages counts the pages they wrote (tree nodes, freelist, meta).
	Pages uint64
	// Bytes is the size of those pages.
	Bytes uint64
}

// writeCounters accumulates WriteStats from bbolt's per-transaction stats.
type writeCounters struct{ commits, pages, bytes atomic.Uint64 }

// add counts one committed transaction: its allocated dirty pages (every
// one is written) and the meta page.
func (w *writeCounters) add(st bbolt.TxStats) {
	w.commits.Add(1)
	w.pages.Add(uint64(st.GetPageCount()) + 1)
	w.bytes.Add(uint64(st.GetPageAlloc()))
}

// DeliveryWrites returns what the delivery plane's committed transactions
// wrote since Open.
func (d *DB) DeliveryWrites() WriteStats {
	w := &d.deliveryWrites
	st := WriteStats{Commits: w.commits.Load(), Pages: w.pages.Load(), Bytes: w.bytes.Load()}
	st.Bytes += st.Commits * uint64(d.bolt.Info().PageSize)
	return st
}

// View runs fn in a bbolt read-only transaction (a consistent snapshot).
func (s *deliveryStore) View(ctx context.Context, fn func(tx persistence.DeliveryReader) error) error {
	if err := s.check(ctx, "view"); err != nil {
		return err
	}
	return mapErr("delivery view", s.d.view(func(btx *wtx) error {
		tx, err := newDeliveryTx(s.d, btx)
		if err != nil {
			return err
		}
		defer func() { tx.done = true }()
		return fn(tx)
	}))
}

// deliveryTx implements persistence.DeliveryTx over one bbolt transaction.
type deliveryTx struct {
	d    *DB
	tx   *wtx
	done bool

	// opened caches the buckets this transaction opened (bucket): a
	// read-only bbolt transaction looks a bucket up anew on every
	// Tx.Bucket, and most transactions need two or three of them.
	opened [8]openedBucket
	// skippedDeltas are this transaction's changes to the skipped-key
	// counts, by addrKey, written once before the commit (flushSkipped).
	skippedDeltas map[string]int64
	// counters are the bucketInMeta counters this transaction read or
	// moved (cachedCounter), written once before the commit.
	counters []cachedCounter
}

type openedBucket struct {
	name []byte
	b    *wbucket
	c    *wcursor // get's cursor (nil until the first get)
}

// get is b.Get through one cursor per bucket and transaction: bbolt's Get
// makes a new cursor and grows its stack on every call (a third of the
// delivery store's allocations); Seek repositions from the root, so the
// cursor stays valid across the transaction's writes.
func (t *deliveryTx) get(b *wbucket, k []byte) []byte {
	for i := range t.opened {
		o := &t.opened[i]
		if o.b == nil {
			break
		}
		if o.b != b {
			continue
		}
		if o.c == nil {
			o.c = b.Cursor()
		}
		ck, v := o.c.Seek(k)
		if !bytes.Equal(ck, k) {
			return nil
		}
		return v
	}
	return b.Get(k)
}

func newDeliveryTx(d *DB, btx *wtx) (*deliveryTx, error) {
	return &deliveryTx{d: d, tx: btx}, nil
}

var errDeliveryReadOnly = errors.New("bolt: write in a read-only delivery transaction")

func (t *deliveryTx) check(write bool) error {
	if t.done {
		return errTxDone
	}
	if write && !t.tx.Writable() {
		return errDeliveryReadOnly
	}
	return nil
}

func checkPeer(peer messages.DeviceAddress) error {
	if err := peer.Validate(); err != nil {
		return fmt.Errorf("bolt: delivery: %w", err)
	}
	return nil
}

// open returns the plaintext of a stored sealed value (a copy).
func (t *deliveryTx) open(what string, rt persistence.RecordType, identity, v []byte) ([]byte, error) {
	if t.d.opts.Sealer == nil {
		return clone(v), nil
	}
	pt, err := t.d.opts.Sealer.Open(rt, identity, v)
	if err != nil {
		if errors.Is(err, persistence.ErrCorrupt) {
			return nil, fmt.Errorf("bolt: %s: %w", what, err)
		}
		return nil, corrupt(what, err)
	}
	return pt, nil
}

// openOf is open of a record of peer with its label ("kind peer") built
// only on failure: peer.String() and the concatenation were allocations
// on every read of a pending frame, an outbound body or a processed entry.
func (t *deliveryTx) openOf(kind string, peer messages.DeviceAddress, rt persistence.RecordType, identity, v []byte) ([]byte, error) {
	s := t.d.opts.Sealer
	if s == nil {
		return clone(v), nil
	}
	if pt, err := s.Open(rt, identity, v); err == nil {
		return pt, nil
	}
	return t.open(kind+" "+peer.String(), rt, identity, v)
}

func (t *deliveryTx) seal(what string, rt persistence.RecordType, identity, v []byte) ([]byte, error) {
	if t.d.opts.Sealer == nil {
		return clone(v), nil
	}
	out, err := t.d.opts.Sealer.Seal(rt, identity, v)
	if err != nil {
		return nil, fmt.Errorf("bolt: seal %s: %w", what, err)
	}
	return out, nil
}

func (t *deliveryTx) getSealed(what string, bucket, key []byte, rt persistence.RecordType, identity []byte) ([]byte, bool, error) {
	if err := t.check(false); err != nil {
		return nil, false, err
	}
	b, err := t.bucket(bucket)
	if err != nil {
		return nil, false, err
	}
	v := t.get(b, key)
	if v == nil {
		return nil, false, nil
	}
	pt, err := t.open(what, rt, identity, v)
	if err != nil {
		return nil, false, err
	}
	if pt == nil {
		pt = []byte{}
	}
	return pt, true, nil
}

func (t *deliveryTx) putSealed(what string, bucket, key []byte, rt persistence.RecordType, identity, v []byte) error {
	if err := t.check(true); err != nil {
		return err
	}
	b, err := t.bucket(bucket)
	if err != nil {
		return err
	}
	s, err := t.seal(what, rt, identity, v)
	if err != nil {
		return err
	}
	if s == nil {
		s = []byte{}
	}
	return b.Put(key, s)
}

func (t *deliveryTx) LocalIdentity() ([]byte, bool, error) {
	return t.getSealed("local identity", bucketDeliveryMeta, deliveryKeyIdentity, persistence.RecordIdentity, sealed.DeviceIdentity())
}

func (t *deliveryTx) Prekeys() ([]byte, bool, error) {
	return t.getSealed("prekeys", bucketDeliveryMeta, deliveryKeyPrekeys, persistence.RecordPrekey, sealed.PrekeyIdentity([]byte(persistence.PrekeyStoreIdentity)))
}

func (t *deliveryTx) Session(peer messages.DeviceAddress) ([]byte, bool, error) {
	if err := checkPeer(peer); err != nil {
		return nil, false, err
	}
	return t.getSealed("session "+peer.String(), bucketDeliverySessions, addrKey(peer), persistence.RecordSession, sessionIdentity(peer))
}

func (t *deliveryTx) Pin(peer messages.DeviceAddress) (messages.IdentityKey, bool, error) {
	var k messages.IdentityKey
	if err := t.check(false); err != nil {
		return k, false, err
	}
	if err := checkPeer(peer); err != nil {
		return k, false, err
	}
	v, ok, err := t.getSealed("pin "+peer.String(), bucketDeliveryPins, addrKey(peer), persistence.RecordPin, pinIdentity(peer))
	if err != nil || !ok {
		return k, false, err
	}
	if len(v) != len(k.Sign)+len(k.DH) {
		return k, false, corrupt("pin "+peer.String(), fmt.Errorf("%d bytes", len(v)))
	}
	copy(k.Sign[:], v[:len(k.Sign)])
	copy(k.DH[:], v[len(k.Sign):])
	return k, true, nil
}

func (t *deliveryTx) Sessions(after *messages.DeviceAddress, fn func(messages.DeviceAddress) (bool, error)) error {
	if err := t.check(false); err != nil {
		return err
	}
	var start []byte
	var first []byte
	if after != nil {
		first = addrKey(*after)
		start = first
	}
	sessions, err := t.bucket(bucketDeliverySessions)
	if err != nil {
		return err
	}
	return scan(sessions, start, nil, func(k, _ []byte) (bool, error) {
		if first != nil && bytes.Compare(k, first) <= 0 {
			return true, nil
		}
		if err := t.check(false); err != nil {
			return false, err
		}
		a, err := parseAddrKey(k)
		if err != nil {
			return false, err
		}
		return fn(a)
	})
}

func (t *deliveryTx) PutLocalIdentity(identity []byte) error {
	return t.putSealed("local identity", bucketDeliveryMeta, deliveryKeyIdentity, persistence.RecordIdentity, sealed.DeviceIdentity(), identity)
}

func (t *deliveryTx) PutPrekeys(prekeys []byte) error {
	return t.putSealed("prekeys", bucketDeliveryMeta, deliveryKeyPrekeys, persistence.RecordPrekey, sealed.PrekeyIdentity([]byte(persistence.PrekeyStoreIdentity)), prekeys)
}

func (t *deliveryTx) PutSession(peer messages.DeviceAddress, record []byte) error {
	if err := checkPeer(peer); err != nil {
		return err
	}
	if err := t.putSealed("session "+peer.String(), bucketDeliverySessions, addrKey(peer), persistence.RecordSession, sessionIdentity(peer), record); err != nil {
		return err
	}
	_, err := t.addCounter(inMetaSessionWrites, 1)
	return err
}

func (t *deliveryTx) SessionWrites() (uint64, error) {
	if err := t.check(false); err != nil {
		return 0, err
	}
	return t.counter(inMetaSessionWrites)
}

func (t *deliveryTx) RaiseSessionWrites(floor uint64) error {
	v, err := t.addCounter(inMetaSessionWrites, 0)
	if err != nil || v >= floor {
		return err
	}
	c, err := t.cachedCounter(inMetaSessionWrites)
	if err != nil {
		return err
	}
	c.v, c.dirty = floor, true
	return nil
}

func (t *deliveryTx) DeleteSession(peer messages.DeviceAddress) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	sessions, err := t.bucket(bucketDeliverySessions)
	if err != nil {
		return err
	}
	if err := sessions.Delete(addrKey(peer)); err != nil {
		return err
	}
	if _, err := t.addCounter(inMetaSessionWrites, 1); err != nil {
		return err
	}
	_, err = t.deleteSkipped(peer, -1)
	return err
}

func (t *deliveryTx) PutPin(peer messages.DeviceAddress, identity messages.IdentityKey) error {
	if err := t.check(true); err != nil {
		return err
	}
	if err := checkPeer(peer); err != nil {
		return err
	}
	return t.putSealed("pin "+peer.String(), bucketDeliveryPins, addrKey(peer), persistence.RecordPin, pinIdentity(peer), identity.Bytes())
}

// ImportLegacyProcessed implements persistence.LegacyImporter: the legacy
// marker is sealed inside each entry (RecordProcessedEntry), in one
// transaction.
func (s *deliveryStore) ImportLegacyProcessed(ctx context.Context, entries []persistence.LegacyProcessed) error {
	return s.Update(ctx, func(ptx persistence.DeliveryTx) error {
		t := ptx.(*deliveryTx)
		for _, e := range entries {
			p, err := persistence.CheckLegacyProcessed(e)
			if err != nil {
				return err
			}
			if err := t.check(true); err != nil {
				return err
			}
			if err := t.putProcessed(p); err != nil {
				return err
			}
		}
		return nil
	})
}
