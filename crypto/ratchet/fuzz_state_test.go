package ratchet

import (
	"bytes"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// The stored-state decoders read what storage hands back (sealed, but a
// damaged or hostile file must still fail cleanly): no panics, and what
// they accept re-encodes to a form that decodes again and is stable. (They
// accept some non-canonical forms — null for an empty list — which is
// harmless for local state we always write canonically.)

func stable[T any](t *testing.T, v T, marshal func(T) ([]byte, error), unmarshal func([]byte) (T, error)) {
	once, err := marshal(v)
	if err != nil {
		t.Fatalf("accepted value does not re-encode: %v", err)
	}
	back, err := unmarshal(once)
	if err != nil {
		t.Fatalf("re-encoded value does not decode: %v", err)
	}
	twice, err := marshal(back)
	if err != nil || !bytes.Equal(once, twice) {
		t.Fatalf("encoding not stable: %v", err)
	}
}

func FuzzUnmarshalState(f *testing.F) {
	a, b := established(f, DefaultConfig())
	for _, r := range a.recs {
		f.Add(mustState(f, r))
	}
	for _, r := range b.recs {
		f.Add(mustState(f, r))
	}
	// A record with skipped keys, and the same in the version-1 layout
	// (skipped keys without times).
	cfg := DefaultConfig()
	a.send(f, cfg, b, []byte("skipped"))
	b.mustRecv(f, cfg, a, a.send(f, cfg, b, []byte("x")), nil)
	f.Add(mustState(f, b.recs["alice"]))
	f.Add(stateV1(f, b.recs["alice"]))
	f.Add(mustState(f, SessionRecord{}))
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := UnmarshalState(data)
		if err != nil {
			return
		}
		stable(t, rec, MarshalState, UnmarshalState)
	})
}

func FuzzUnmarshalIdentity(f *testing.F) {
	id, err := NewIdentity()
	if err != nil {
		f.Fatal(err)
	}
	enc, err := MarshalIdentity(id)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc)
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := UnmarshalIdentity(data)
		if err != nil {
			return
		}
		stable(t, got, MarshalIdentity, UnmarshalIdentity)
	})
}

func FuzzUnmarshalPrekeyStore(f *testing.F) {
	d := newDevice(f, "fuzz")
	f.Add(mustPrekeys(f, d.prekeys))
	f.Add(prekeysV1(f, d.prekeys))
	f.Add(prekeysV2(f, d.prekeys))
	// With accepted last-resort initiations and a closed signed prekey.
	a := newDevice(f, "alice")
	for range 2 {
		env := initiateTo(f, DefaultConfig(), a, d, lastResort(f, d), "x")
		d.recs["alice"] = SessionRecord{}
		d.mustRecv(f, DefaultConfig(), a, env, nil)
	}
	pc := d.prekeys.Config()
	pc.MaxAcceptedInitiations = 2
	pk, _ := d.prekeys.WithConfig(pc)
	pk, _, _ = pk.Refresh(d.id, t0)
	f.Add(mustPrekeys(f, d.prekeys))
	f.Add(mustPrekeys(f, pk))
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := UnmarshalPrekeyStore(data)
		if err != nil {
			return
		}
		stable(t, got, MarshalPrekeyStore, UnmarshalPrekeyStore)
	})
}

// stateV1 encodes r in the version-1 record layout.
func stateV1(tb testing.TB, r SessionRecord) []byte {
	tb.Helper()
	var w3 wireRecord
	if err := messages.Unmarshal("test", mustState(tb, r), &w3, MaxStateSize); err != nil {
		tb.Fatal(err)
	}
	w := wireRecordV2{V: 1, Sessions: w3.Sessions, Retired: w3.Retired}
	for i := range w.Sessions {
		var old []byte
		for p := w.Sessions[i].Skipped; len(p) > 0; p = p[skippedEntry:] {
			old = append(old, p[8:44]...)
			old = append(old, p[52:84]...)
		}
		w.Sessions[i].Skipped = old
	}
	b, err := messages.Marshal(&w)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// prekeysV2Wire is p in the version-2 prekey store layout (one-time
// entries without their issue time).
func prekeysV2Wire(tb testing.TB, p PrekeyStore) wirePrekeyStoreV2 {
	tb.Helper()
	var w3 wirePrekeyStoreV3
	if err := messages.Unmarshal("test", mustPrekeys(tb, p), &w3, maxPrekeyStoreSize); err != nil {
		tb.Fatal(err)
	}
	w := wirePrekeyStoreV2{V: 2, NextID: w3.NextID, Signed: w3.Signed, KEM: w3.KEM, Accepted: w3.Accepted}
	copy(w.Cfg[:], w3.Cfg[:6])
	for e := w3.OneTime; len(e) > 0; e = e[oneTimeEntryV3:] {
		w.OneTime = append(append(w.OneTime, e[:5]...), e[13:oneTimeEntryV3]...)
	}
	return w
}

// prekeysV2 encodes p in the version-2 prekey store layout.
func prekeysV2(tb testing.TB, p PrekeyStore) []byte {
	tb.Helper()
	w := prekeysV2Wire(tb, p)
	b, err := messages.Marshal(&w)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// prekeysV1 encodes p in the version-1 prekey store layout.
func prekeysV1(tb testing.TB, p PrekeyStore) []byte {
	tb.Helper()
	w := prekeysV2Wire(tb, p)
	old := wirePrekeyStore{V: 1, NextID: w.NextID, KEM: w.KEM, OneTime: w.OneTime}
	copy(old.Cfg[:], w.Cfg[:5])
	for _, k := range w.Signed {
		old.Signed = append(old.Signed, wireSignedKey{ID: k.ID, Priv: k.Priv, Sig: k.Sig, Created: k.Created, Expires: k.Expires})
	}
	b, err := messages.Marshal(&old)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
