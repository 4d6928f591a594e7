package sealed

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

func mustNew(t testing.TB, cur Key, older ...Key) *Sealer {
	t.Helper()
	s, err := New(cur, older...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func keyOf(b byte) Key {
	var k Key
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

// assertOpenErr checks an Open failure matches ErrOpen and the expected
// reason.
func assertOpenErr(t *testing.T, err error, reason OpenReason) {
	t.Helper()
	if err == nil {
		t.Fatal("Open succeeded, want failure")
	}
	if !errors.Is(err, ErrOpen) {
		t.Fatalf("err %v does not match ErrOpen", err)
	}
	var oe *OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("err %v is not *OpenError", err)
	}
	if reason != 0 && oe.Reason != reason {
		t.Fatalf("reason = %v, want %v", oe.Reason, reason)
	}
}

func TestKeyIDFrozen(t *testing.T) {
	// SHA-256("syncmesh-storage-key-id" || 00..1f)[0:4]
	id := vectorKey().ID()
	if got := hex.EncodeToString(id[:]); got != "35444b58" {
		t.Fatalf("key id = %s", got)
	}
}

func TestFrozenVectorsSealExactly(t *testing.T) {
	s := mustNew(t, vectorKey())
	for _, v := range vectors() {
		t.Run(v.name, func(t *testing.T) {
			if !bytes.Equal(v.identity, Identity(v.parts...)) {
				t.Fatal("identity helper disagrees with Identity(parts...)")
			}
			out, err := s.sealWithNonce(v.typ, v.identity, v.plaintext, vectorNonce(v.nonce))
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(out); got != v.sealed {
				t.Fatalf("sealed =\n%s\nwant\n%s", got, v.sealed)
			}
			if len(out) != len(v.plaintext)+Overhead {
				t.Fatalf("len = %d, want plaintext+%d", len(out), Overhead)
			}
		})
	}
}

func TestFrozenVectorsOpen(t *testing.T) {
	s := mustNew(t, vectorKey())
	for _, v := range vectors() {
		t.Run(v.name, func(t *testing.T) {
			sealed, _ := hex.DecodeString(v.sealed)
			pt, err := s.Open(v.typ, v.identity, sealed)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pt, v.plaintext) {
				t.Fatalf("plaintext = %q, want %q", pt, v.plaintext)
			}
			if !s.IsCurrent(sealed) {
				t.Fatal("vector not reported current under its key")
			}
		})
	}
}

func TestFrozenVectorsFailUnderOtherRecordType(t *testing.T) {
	s := mustNew(t, vectorKey())
	for _, v := range vectors() {
		sealed, _ := hex.DecodeString(v.sealed)
		for _, other := range vectors() {
			if other.typ == v.typ {
				continue
			}
			_, err := s.Open(other.typ, v.identity, sealed)
			assertOpenErr(t, err, ReasonAuth)
		}
		// Also an unassigned type number.
		_, err := s.Open(v.typ+100, v.identity, sealed)
		assertOpenErr(t, err, ReasonAuth)
	}
}

func TestPendingFrameAndDigestOfOneRowNotSwappable(t *testing.T) {
	// Types 11 and 12 share an identity; the record type alone keeps them apart.
	s := mustNew(t, vectorKey())
	id := MessageIdentity([]byte("alice"), []byte("tablet"), []byte("m1"))
	frame, _ := s.Seal(recPendingFrame, id, []byte("frame"))
	dig, _ := s.Seal(recProcessedDigest, id, []byte("digest"))
	_, err := s.Open(recProcessedDigest, id, frame)
	assertOpenErr(t, err, ReasonAuth)
	_, err = s.Open(recPendingFrame, id, dig)
	assertOpenErr(t, err, ReasonAuth)
}

func TestFrozenVectorsFailWhenAnyIdentityPartChanges(t *testing.T) {
	s := mustNew(t, vectorKey())
	for _, v := range vectors() {
		sealed, _ := hex.DecodeString(v.sealed)
		t.Run(v.name, func(t *testing.T) {
			for i := range v.parts {
				mutations := map[string][]byte{
					"flip":   append([]byte{}, v.parts[i]...),
					"append": append(append([]byte{}, v.parts[i]...), 'x'),
					"empty":  {},
				}
				mutations["flip"][0] ^= 0x01
				if len(v.parts[i]) > 1 {
					mutations["truncate"] = v.parts[i][:len(v.parts[i])-1]
				}
				for name, m := range mutations {
					parts := append([][]byte{}, v.parts...)
					parts[i] = m
					_, err := s.Open(v.typ, Identity(parts...), sealed)
					if err == nil {
						t.Fatalf("part %d %s: opened under changed identity", i, name)
					}
					assertOpenErr(t, err, ReasonAuth)
				}
			}
			// Moving bytes across parts, adding or dropping a part, raw
			// (unprefixed) identity: all different rows.
			if len(v.parts) > 1 {
				shifted := append([][]byte{}, v.parts...)
				shifted[0] = append(append([]byte{}, v.parts[0]...), v.parts[1][0])
				shifted[1] = v.parts[1][1:]
				_, err := s.Open(v.typ, Identity(shifted...), sealed)
				assertOpenErr(t, err, ReasonAuth)
				_, err = s.Open(v.typ, Identity(v.parts[:len(v.parts)-1]...), sealed)
				assertOpenErr(t, err, ReasonAuth)
			}
			_, err := s.Open(v.typ, Identity(append(append([][]byte{}, v.parts...), nil)...), sealed)
			assertOpenErr(t, err, ReasonAuth)
			_, err = s.Open(v.typ, bytes.Join(v.parts, nil), sealed)
			assertOpenErr(t, err, ReasonAuth)
			_, err = s.Open(v.typ, nil, sealed)
			assertOpenErr(t, err, ReasonAuth)
		})
	}
}

func TestFrozenVectorsFailOnEveryBitFlip(t *testing.T) {
	s := mustNew(t, vectorKey())
	for _, v := range vectors() {
		sealed, _ := hex.DecodeString(v.sealed)
		for i := range sealed {
			for _, bit := range []byte{0x01, 0x80} {
				d := append([]byte{}, sealed...)
				d[i] ^= bit
				_, err := s.Open(v.typ, v.identity, d)
				want := ReasonAuth
				switch {
				case i == 0:
					want = ReasonVersion
				case i < HeaderSize:
					want = ReasonUnknownKey
				}
				assertOpenErr(t, err, want)
			}
		}
	}
}

func TestOpenRejectsTruncatedAndExtended(t *testing.T) {
	s := mustNew(t, vectorKey())
	v := vectors()[0]
	sealed, _ := hex.DecodeString(v.sealed)
	for n := 0; n < len(sealed); n++ {
		_, err := s.Open(v.typ, v.identity, sealed[:n])
		if n < Overhead {
			assertOpenErr(t, err, ReasonTooShort)
		} else {
			assertOpenErr(t, err, ReasonAuth)
		}
	}
	_, err := s.Open(v.typ, v.identity, append(append([]byte{}, sealed...), 0))
	assertOpenErr(t, err, ReasonAuth)
}

func TestSealOpenRoundTripAndFreshNonces(t *testing.T) {
	s := mustNew(t, keyOf(1))
	id := EventIdentity([]byte("event-1"))
	for _, pt := range [][]byte{nil, {}, []byte("x"), bytes.Repeat([]byte{7}, 4096)} {
		a, err := s.Seal(recEvent, id, pt)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Seal(recEvent, id, pt)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(a[HeaderSize:HeaderSize+NonceSize], b[HeaderSize:HeaderSize+NonceSize]) {
			t.Fatal("two seals used the same nonce")
		}
		got, err := s.Open(recEvent, id, a)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pt) || got == nil {
			t.Fatalf("round trip = %v, want %v (non-nil)", got, pt)
		}
		if len(got) > 0 {
			got[0] ^= 0xff // must not alias the sealed record
			if _, err := s.Open(recEvent, id, a); err != nil {
				t.Fatal("plaintext aliases sealed bytes")
			}
		}
	}
}

func TestSealDoesNotAliasPlaintext(t *testing.T) {
	s := mustNew(t, keyOf(1))
	pt := []byte("secret")
	out, _ := s.Seal(recSession, SessionIdentity([]byte("u"), []byte("d")), pt)
	if bytes.Contains(out, pt) {
		t.Fatal("plaintext visible in sealed record")
	}
}

func TestKeyRotation(t *testing.T) {
	oldK, newK := keyOf(1), keyOf(100)
	oldS := mustNew(t, oldK)
	id := MessageIdentity([]byte("a"), []byte("d"), []byte("m"))
	rec, _ := oldS.Seal(recPendingFrame, id, []byte("frame"))

	rot := mustNew(t, newK, oldK)
	if rot.IsCurrent(rec) {
		t.Fatal("old-key record reported current")
	}
	pt, err := rot.Open(recPendingFrame, id, rec)
	if err != nil || string(pt) != "frame" {
		t.Fatalf("rotated sealer cannot open old record: %v", err)
	}
	resealed, _ := rot.Seal(recPendingFrame, id, pt)
	if !rot.IsCurrent(resealed) {
		t.Fatal("resealed record not current")
	}
	if rot.CurrentKeyID() != newK.ID() {
		t.Fatal("CurrentKeyID is not the current key's id")
	}

	// Once the old key is dropped, old records fail as unknown key, not as
	// missing; new records still open.
	newOnly := mustNew(t, newK)
	_, err = newOnly.Open(recPendingFrame, id, rec)
	assertOpenErr(t, err, ReasonUnknownKey)
	var oe *OpenError
	errors.As(err, &oe)
	if oe.KeyID != oldK.ID() {
		t.Fatalf("OpenError.KeyID = %x, want %x", oe.KeyID, oldK.ID())
	}
	if _, err := newOnly.Open(recPendingFrame, id, resealed); err != nil {
		t.Fatal(err)
	}
	// And a sealer whose current key is old opens neither new record.
	_, err = oldS.Open(recPendingFrame, id, resealed)
	assertOpenErr(t, err, ReasonUnknownKey)
}

func TestIsCurrentRejectsMalformed(t *testing.T) {
	s := mustNew(t, vectorKey())
	rec, _ := hex.DecodeString(vectors()[0].sealed)
	for _, b := range [][]byte{nil, {1}, rec[:HeaderSize-1], append([]byte{2}, rec[1:]...)} {
		if s.IsCurrent(b) {
			t.Fatalf("IsCurrent(%x) = true", b)
		}
	}
	if !s.IsCurrent(rec[:HeaderSize]) {
		t.Fatal("IsCurrent reads only the header; a current header must report true")
	}
}

func TestNewRejectsBadKeys(t *testing.T) {
	if _, err := New(Key{}); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("zero current key: %v", err)
	}
	if _, err := New(keyOf(1), Key{}); !errors.Is(err, ErrZeroKey) {
		t.Fatalf("zero older key: %v", err)
	}
	s, err := New(keyOf(1), keyOf(1), keyOf(2), keyOf(2))
	if err != nil {
		t.Fatalf("repeated identical keys: %v", err)
	}
	if len(s.keys) != 2 {
		t.Fatalf("keys = %d, want 2 after dedupe", len(s.keys))
	}
}

func TestNewRejectsKeyIDCollision(t *testing.T) {
	// A 4-byte key id collides by the birthday bound after ~2^16 keys.
	seen := make(map[[KeyIDSize]byte]Key)
	var a, b Key
	for i := uint32(1); ; i++ {
		var k Key
		k[0], k[1], k[2], k[3] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
		id := k.ID()
		if prev, ok := seen[id]; ok {
			a, b = prev, k
			break
		}
		seen[id] = k
	}
	if _, err := New(a, b); !errors.Is(err, ErrKeyIDCollision) {
		t.Fatalf("colliding keys: %v", err)
	}
}

func TestNilSealer(t *testing.T) {
	var s *Sealer
	if _, err := s.Seal(recEvent, nil, nil); !errors.Is(err, ErrNilSealer) {
		t.Fatal(err)
	}
	if _, err := s.Open(recEvent, nil, nil); !errors.Is(err, ErrNilSealer) {
		t.Fatal(err)
	}
	if s.IsCurrent([]byte{1, 2, 3, 4, 5}) {
		t.Fatal("nil sealer reports current")
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("entropy exhausted") }

func TestSealReportsRandomFailure(t *testing.T) {
	s := mustNew(t, keyOf(1))
	s.rand = failingReader{}
	if _, err := s.Seal(recEvent, nil, []byte("x")); err == nil {
		t.Fatal("Seal succeeded without a nonce")
	}
}

func TestIdentityLengthPrefixing(t *testing.T) {
	ab := Identity([]byte("ab"), []byte("c"))
	bc := Identity([]byte("a"), []byte("bc"))
	if bytes.Equal(ab, bc) {
		t.Fatal(`("ab","c") == ("a","bc")`)
	}
	if got := hex.EncodeToString(ab); got != "00000002616200000001"+"63" {
		t.Fatalf("Identity encoding = %s", got)
	}
	if !bytes.Equal(Identity(), []byte{}) || len(Identity(nil)) != 4 {
		t.Fatal("empty identity encodings")
	}
	if bytes.Equal(Identity(nil), Identity(nil, nil)) {
		t.Fatal("part count not bound")
	}
}

func TestConcurrentUse(t *testing.T) {
	s := mustNew(t, keyOf(1), keyOf(2))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := EventIdentity([]byte{byte(g)})
			for i := range 200 {
				pt := []byte(fmt.Sprintf("g%d-%d", g, i))
				rec, err := s.Seal(recEvent, id, pt)
				if err == nil {
					var got []byte
					got, err = s.Open(recEvent, id, rec)
					if err == nil && !bytes.Equal(got, pt) {
						err = fmt.Errorf("mismatch")
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func FuzzOpen(f *testing.F) {
	for _, v := range vectors() {
		b, _ := hex.DecodeString(v.sealed)
		f.Add(uint8(v.typ), v.identity, b)
	}
	f.Add(uint8(0), []byte{}, []byte{})
	f.Add(uint8(1), []byte{0}, []byte{1, 0x35, 0x44, 0x4b, 0x58})
	s := mustNew(f, vectorKey())
	f.Fuzz(func(t *testing.T, typ uint8, identity, sealed []byte) {
		pt, err := s.Open(messages.RecordType(typ), identity, sealed)
		if err != nil {
			if !errors.Is(err, ErrOpen) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// Anything that opens must be a genuine record: the fuzzer cannot forge
		// a tag, so it must be (a seed) that re-opens to the same plaintext.
		if len(sealed) != len(pt)+Overhead || !s.IsCurrent(sealed) {
			t.Fatalf("opened inconsistent record %x", sealed)
		}
	})
}

func BenchmarkSeal256(b *testing.B) {
	s := mustNew(b, keyOf(1))
	id := MessageIdentity([]byte("alice"), []byte("phone"), []byte("0123456789abcdef"))
	pt := make([]byte, 256)
	b.SetBytes(256)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Seal(recPendingFrame, id, pt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen256(b *testing.B) {
	s := mustNew(b, keyOf(1))
	id := MessageIdentity([]byte("alice"), []byte("phone"), []byte("0123456789abcdef"))
	rec, _ := s.Seal(recPendingFrame, id, make([]byte, 256))
	b.SetBytes(256)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Open(recPendingFrame, id, rec); err != nil {
			b.Fatal(err)
		}
	}
}

func ExampleNew() {
	var k Key
	copy(k[:], "an example 32-byte storage key!!") // use LoadOrCreateKeyFile in practice
	s, err := New(k)
	if err != nil {
		panic(err)
	}
	id := MessageIdentity([]byte("alice"), []byte("phone"), []byte("msg-1"))
	rec, _ := s.Seal(recPendingFrame, id, []byte("frame"))
	pt, err := s.Open(recPendingFrame, id, rec)
	fmt.Println(string(pt), err, s.IsCurrent(rec))

	// The same bytes under another row fail, as corrupt, never as missing.
	other := MessageIdentity([]byte("alice"), []byte("phone"), []byte("msg-2"))
	_, err = s.Open(recPendingFrame, other, rec)
	fmt.Println(errors.Is(err, ErrOpen))
	// Output:
	// frame <nil> true
	// true
}

// Seal and Open build the associated data in their output's spare room:
// what they return ends at its last byte (capacity too), so a caller that
// appends to a record or a plaintext gets a copy and cannot disturb the
// other; long identities (past any small buffer) seal and open as short
// ones do.
func TestRecordsAndPlaintextsEndAtTheirLastByte(t *testing.T) {
	s := mustNew(t, vectorKey())
	long := bytes.Repeat([]byte{0xab}, 300)
	for _, identity := range [][]byte{nil, EventIdentity(make([]byte, 32)), Identity(long, long)} {
		for _, pt := range [][]byte{nil, []byte("p"), bytes.Repeat([]byte("plaintext "), 40)} {
			rec, err := s.Seal(recEvent, identity, pt)
			if err != nil {
				t.Fatal(err)
			}
			if cap(rec) != len(rec) || len(rec) != len(pt)+Overhead {
				t.Fatalf("identity %d bytes, plaintext %d: record len %d cap %d", len(identity), len(pt), len(rec), cap(rec))
			}
			keep := bytes.Clone(rec)
			got, err := s.Open(recEvent, identity, rec)
			if err != nil || !bytes.Equal(got, pt) || got == nil {
				t.Fatalf("identity %d bytes, plaintext %d: open = %q, %v", len(identity), len(pt), got, err)
			}
			if cap(got) != len(got) {
				t.Fatalf("plaintext len %d cap %d", len(got), cap(got))
			}
			_ = append(got, 'x')
			_ = append(rec, 'y')
			again, err := s.Open(recEvent, identity, rec)
			if err != nil || !bytes.Equal(again, pt) || !bytes.Equal(rec, keep) {
				t.Fatalf("appending to the outputs changed a record or its plaintext: %v", err)
			}
		}
	}
}
