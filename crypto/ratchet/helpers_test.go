package ratchet

import (
	"bytes"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// device is one test device: identity, prekeys and one record per peer.
type device struct {
	name    string
	id      Identity
	prekeys PrekeyStore
	recs    map[string]SessionRecord
}

func newDevice(t testing.TB, name string) *device {
	t.Helper()
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultPrekeyConfig()
	cfg.OneTimeBatch, cfg.OneTimeThreshold = 10, 3
	cfg.MaxOneTime = 40
	pk, err := NewPrekeyStore(id, t0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &device{name: name, id: id, prekeys: pk, recs: map[string]SessionRecord{}}
}

func (d *device) bundle(t testing.TB) *messages.PrekeyBundle {
	t.Helper()
	pk, b, err := d.prekeys.IssueBundle(d.id.Public())
	if err != nil {
		t.Fatal(err)
	}
	d.prekeys = pk
	// Through the wire format, as a real bundle travels.
	enc, err := messages.EncodePrekeyBundle(&b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := messages.DecodePrekeyBundle(enc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (d *device) initiate(t testing.TB, cfg Config, peer *device) SessionInfo {
	t.Helper()
	rec, info, err := cfg.Initiate(d.recs[peer.name], d.id, peer.bundle(t), routeOf(d, peer))
	if err != nil {
		t.Fatal(err)
	}
	d.recs[peer.name] = rec
	return info
}

func (d *device) send(t testing.TB, cfg Config, peer *device, pt []byte) []byte {
	t.Helper()
	rec, env, err := cfg.Encrypt(d.recs[peer.name], pt)
	if err != nil {
		t.Fatal(err)
	}
	d.recs[peer.name] = rec
	return env
}

func (d *device) recv(cfg Config, peer *device, env []byte, now time.Time) (DecryptResult, error) {
	res, err := cfg.Decrypt(d.recs[peer.name], d.id, d.prekeys, env, routeOf(peer, d), now)
	if err != nil {
		return res, err
	}
	d.recs[peer.name] = res.Record
	d.prekeys = res.Prekeys
	return res, nil
}

func (d *device) mustRecv(t testing.TB, cfg Config, peer *device, env []byte, want []byte) DecryptResult {
	t.Helper()
	res, err := d.recv(cfg, peer, env, t0)
	if err != nil {
		t.Fatalf("%s: decrypt from %s: %v", d.name, peer.name, err)
	}
	if want != nil && !bytes.Equal(res.Plaintext, want) {
		t.Fatalf("%s: plaintext %q, want %q", d.name, res.Plaintext, want)
	}
	return res
}

// addr is the device's address: its name, device 1.
func (d *device) addr() messages.DeviceAddress {
	return messages.DeviceAddress{User: d.name, Device: 1}
}

// routeOf is the route of an envelope from → to.
func routeOf(from, to *device) Route { return Route{From: from.addr(), To: to.addr()} }

func mustState(t testing.TB, r SessionRecord) []byte {
	t.Helper()
	b, err := MarshalState(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustPrekeys(t testing.TB, p PrekeyStore) []byte {
	t.Helper()
	b, err := MarshalPrekeyStore(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// established returns two devices with an acknowledged session.
func established(t testing.TB, cfg Config) (a, b *device) {
	t.Helper()
	a, b = newDevice(t, "alice"), newDevice(t, "bob")
	a.initiate(t, cfg, b)
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("hello")), []byte("hello"))
	a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("hi")), []byte("hi"))
	return a, b
}
