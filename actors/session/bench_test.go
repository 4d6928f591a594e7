package session_test

import "testing"

// BenchmarkRoundTrip measures one encrypt (alice's actor) plus one decrypt
// (bob's actor), each persisted to a memory store, on an established
// session.
func BenchmarkRoundTrip(b *testing.B) {
	ms := newMesh(b)
	a := ms.add(aliceAddr, nil, nil)
	bb := ms.add(bobAddr, nil, nil)
	mustDecrypt(b, bb, a.addr, mustEncrypt(b, a, bb.addr, "hello"), "hello")
	mustDecrypt(b, a, bb.addr, mustEncrypt(b, bb, a.addr, "hi"), "hi")
	pt := make([]byte, 256)
	b.SetBytes(int64(len(pt)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		env, err := a.m.Encrypt(bg, bb.addr, pt)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bb.m.Decrypt(bg, a.addr, env); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoundTripPingPong alternates directions, so every message takes
// a DH ratchet step.
func BenchmarkRoundTripPingPong(b *testing.B) {
	ms := newMesh(b)
	a := ms.add(aliceAddr, nil, nil)
	bb := ms.add(bobAddr, nil, nil)
	mustDecrypt(b, bb, a.addr, mustEncrypt(b, a, bb.addr, "hello"), "hello")
	pt := make([]byte, 256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		from, to := a, bb
		if i%2 == 1 {
			from, to = bb, a
		}
		i++
		env, err := from.m.Encrypt(bg, to.addr, pt)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := to.m.Decrypt(bg, from.addr, env); err != nil {
			b.Fatal(err)
		}
	}
}
