package ratchet

import (
	"bytes"
	"testing"
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
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := UnmarshalPrekeyStore(data)
		if err != nil {
			return
		}
		stable(t, got, MarshalPrekeyStore, UnmarshalPrekeyStore)
	})
}
