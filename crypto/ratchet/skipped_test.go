package ratchet

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// splitStore is a store of records kept the layout-13 way: the record
// without its keys, and one entry per skipped key.
type splitStore struct {
	state []byte
	keys  map[uint64][]byte
}

func (s *splitStore) apply(t *testing.T, base, next SessionRecord) (puts, dels int) {
	t.Helper()
	put, del := SkippedKeyChanges(base, next)
	for _, seq := range del {
		if _, ok := s.keys[seq]; !ok {
			t.Fatalf("delete of key %d, which is not stored", seq)
		}
		delete(s.keys, seq)
	}
	for _, k := range put {
		s.keys[k.Seq] = k.Entry
	}
	var err error
	if s.state, err = MarshalStateWithoutKeys(next); err != nil {
		t.Fatal(err)
	}
	return len(put), len(del)
}

func (s *splitStore) load(t *testing.T) SessionRecord {
	t.Helper()
	var keys []SkippedKey
	for seq, e := range s.keys {
		keys = append(keys, SkippedKey{Seq: seq, Entry: e})
	}
	slices.SortFunc(keys, func(a, b SkippedKey) int { return cmp.Compare(a.Seq, b.Seq) })
	rec, err := UnmarshalStateWithKeys(s.state, keys)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestSkippedKeyChangesReplayToTheRecord: over random runs (6 seeds × 150
// steps) of out-of-order delivery, replies, new sessions, per-session and
// per-record caps and expiry, applying each step's SkippedKeyChanges to a
// store of separate entries always loads back exactly the record (the
// same encoding), an encryption changes no key, and a decryption puts
// only the keys it skipped.
func TestSkippedKeyChangesReplayToTheRecord(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 13))
			cfg := DefaultConfig()
			cfg.MaxSkippedKeys, cfg.MaxSkippedKeysPerRecord, cfg.MaxArchivedSessions = 12, 25, 2
			cfg.MaxSkippedKeyAge = 10 * time.Minute
			a, b := established(t, cfg)
			st := &splitStore{keys: map[uint64][]byte{}}
			st.apply(t, SessionRecord{}, b.recs["alice"])
			now := t0
			var queue [][]byte
			for step := range 150 {
				now = now.Add(time.Duration(r.IntN(90)) * time.Second)
				base := b.recs["alice"]
				switch op := r.IntN(20); {
				case op < 8:
					queue = append(queue, a.send(t, cfg, b, []byte("m")))
					continue
				case op < 16 && len(queue) > 0:
					i := r.IntN(len(queue))
					env := queue[i]
					queue = slices.Delete(queue, i, i+1)
					res, err := b.recv(cfg, a, env, now)
					if err != nil {
						// A key evicted or expired, or a session dropped from
						// the archive: refused, nothing changed.
						if !errors.Is(err, ErrReplay) && !errors.Is(err, ErrTooManySkipped) && !errors.Is(err, ErrUnknownSession) {
							t.Fatalf("step %d: %v", step, err)
						}
						continue
					}
					added := res.Record.nextSeq - max(base.nextSeq, 1)
					if puts, _ := st.apply(t, base, res.Record); uint64(puts) > added {
						t.Fatalf("step %d: %d keys put, %d skipped", step, puts, added)
					}
				case op < 19:
					env := b.send(t, cfg, a, []byte("r"))
					if puts, dels := st.apply(t, base, b.recs["alice"]); puts != 0 || dels != 0 {
						t.Fatalf("step %d: an encryption put %d and deleted %d keys", step, puts, dels)
					}
					_, _ = a.recv(cfg, b, env, now) // may name a session alice dropped
				default:
					a.initiate(t, cfg, b)
					queue = append(queue, a.send(t, cfg, b, []byte("first")))
					continue
				}
				got, want := mustState(t, st.load(t)), mustState(t, b.recs["alice"])
				if !bytes.Equal(got, want) {
					t.Fatalf("step %d: the record loaded from the entries differs from the record", step)
				}
				if n := b.recs["alice"].SkippedKeyCount(); len(st.keys) != n {
					t.Fatalf("step %d: %d entries stored for %d keys", step, len(st.keys), n)
				}
			}
		})
	}
}

// TestSkippedKeyStepWritesOnlyItsKeys: with 2 000 keys in the record, a
// step that skips 3 more puts 3 entries and a step that uses one deletes
// one; the record without keys is as small as with none.
func TestSkippedKeyStepWritesOnlyItsKeys(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	var late []byte
	for i := range 2001 {
		env := a.send(t, cfg, b, []byte("x"))
		if i == 7 {
			late = env
		}
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("fill")), nil)
	base := b.recs["alice"]
	if n := base.SkippedKeyCount(); n != 2000 {
		t.Fatalf("%d keys, want 2000", n)
	}
	small, err := MarshalStateWithoutKeys(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(small) > 1024 {
		t.Fatalf("record without its keys is %d bytes", len(small))
	}
	for range 3 {
		a.send(t, cfg, b, []byte("skipped"))
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("after")), nil)
	put, del := SkippedKeyChanges(base, b.recs["alice"])
	if len(put) != 3 || len(del) != 3 {
		// The record is at its cap: three new keys push the three oldest out.
		t.Fatalf("a step skipping 3 keys: %d put, %d deleted; want 3, 3", len(put), len(del))
	}
	for _, k := range put {
		if len(k.Entry) != SkippedKeyEntrySize {
			t.Fatalf("entry of %d bytes", len(k.Entry))
		}
	}
	base = b.recs["alice"]
	if _, err := b.recv(cfg, a, late, t0); err != nil {
		t.Fatal(err)
	}
	put, del = SkippedKeyChanges(base, b.recs["alice"])
	if len(put) != 0 || len(del) != 1 {
		t.Fatalf("a step using a skipped key: %d put, %d deleted; want 0, 1", len(put), len(del))
	}
}

// TestVersion2KeysAreNumberedOnLoad: keys of a record from before version
// 3 are numbered 1… in order, and the next number follows them.
func TestVersion2KeysAreNumberedOnLoad(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	for range 4 {
		a.send(t, cfg, b, []byte("skipped"))
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("x")), nil)
	rec, err := UnmarshalState(stateV1(t, b.recs["alice"]))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, k := range SkippedKeys(rec) {
		seqs = append(seqs, k.Seq)
	}
	if fmt.Sprint(seqs) != "[1 2 3 4]" || rec.nextSeq != 5 {
		t.Fatalf("numbers %v, next %d; want [1 2 3 4], 5", seqs, rec.nextSeq)
	}
}

// TestSkippedEntriesAreCheckedOnLoad: a damaged entry, or one that does not
// fit the record, is ErrMalformed (another entry version:
// ErrUnsupportedVersion), never a silently different record.
func TestSkippedEntriesAreCheckedOnLoad(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	for range 2 {
		a.send(t, cfg, b, []byte("skipped"))
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("x")), nil)
	rec := b.recs["alice"]
	state, err := MarshalStateWithoutKeys(rec)
	if err != nil {
		t.Fatal(err)
	}
	keys := SkippedKeys(rec)
	if len(keys) != 2 {
		t.Fatalf("%d keys", len(keys))
	}
	if got, err := UnmarshalStateWithKeys(state, keys); err != nil || !bytes.Equal(mustState(t, got), mustState(t, rec)) {
		t.Fatalf("round trip: %v", err)
	}
	mod := func(f func(k []SkippedKey) []SkippedKey) []SkippedKey {
		c := make([]SkippedKey, len(keys))
		for i, k := range keys {
			c[i] = SkippedKey{Seq: k.Seq, Entry: bytes.Clone(k.Entry)}
		}
		return f(c)
	}
	for _, tc := range []struct {
		name string
		keys []SkippedKey
		kind error
	}{
		{"short", mod(func(k []SkippedKey) []SkippedKey { k[0].Entry = k[0].Entry[:50]; return k }), messages.ErrMalformed},
		{"long", mod(func(k []SkippedKey) []SkippedKey { k[0].Entry = append(k[0].Entry, 0); return k }), messages.ErrMalformed},
		{"version", mod(func(k []SkippedKey) []SkippedKey { k[0].Entry[0] = 2; return k }), messages.ErrUnsupportedVersion},
		{"number 0", mod(func(k []SkippedKey) []SkippedKey { k[0].Seq = 0; return k }), messages.ErrMalformed},
		{"number not below next", mod(func(k []SkippedKey) []SkippedKey { k[0].Seq = rec.nextSeq; return k }), messages.ErrMalformed},
		{"duplicate", mod(func(k []SkippedKey) []SkippedKey { k[1].Seq = k[0].Seq; return k }), messages.ErrMalformed},
		{"unknown session", mod(func(k []SkippedKey) []SkippedKey { k[0].Entry[1] ^= 1; return k }), messages.ErrMalformed},
	} {
		if _, err := UnmarshalStateWithKeys(state, tc.keys); !errors.Is(err, tc.kind) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.kind)
		}
	}
	// A whole record (keys inside) joined with the same keys again.
	if _, err := UnmarshalStateWithKeys(mustState(t, rec), keys); !errors.Is(err, messages.ErrMalformed) {
		t.Errorf("keys in the record and beside it: %v", err)
	}
}

func FuzzSkippedKeyEntry(f *testing.F) {
	cfg := DefaultConfig()
	a, b := established(f, cfg)
	a.send(f, cfg, b, []byte("skipped"))
	b.mustRecv(f, cfg, a, a.send(f, cfg, b, []byte("x")), nil)
	for _, k := range SkippedKeys(b.recs["alice"]) {
		f.Add(k.Seq, k.Entry)
	}
	f.Add(uint64(0), []byte{1})
	f.Add(uint64(1), make([]byte, SkippedKeyEntrySize))
	f.Fuzz(func(t *testing.T, seq uint64, data []byte) {
		id, k, err := decodeSkippedEntry(seq, data)
		if err != nil {
			if !errors.Is(err, messages.ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		if again := encodeSkippedEntry(id, k); again.Seq != seq || !bytes.Equal(again.Entry, data) {
			t.Fatal("entry does not re-encode to its bytes")
		}
	})
}

func FuzzUnmarshalStateWithKeys(f *testing.F) {
	cfg := DefaultConfig()
	a, b := established(f, cfg)
	a.send(f, cfg, b, []byte("skipped"))
	b.mustRecv(f, cfg, a, a.send(f, cfg, b, []byte("x")), nil)
	rec := b.recs["alice"]
	state, err := MarshalStateWithoutKeys(rec)
	if err != nil {
		f.Fatal(err)
	}
	for _, k := range SkippedKeys(rec) {
		f.Add(state, k.Seq, k.Entry)
	}
	f.Add(mustState(f, rec), uint64(1), []byte{1})
	f.Fuzz(func(t *testing.T, state []byte, seq uint64, entry []byte) {
		rec, err := UnmarshalStateWithKeys(state, []SkippedKey{{Seq: seq, Entry: entry}})
		if err != nil {
			if !errors.Is(err, messages.ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// What loads, stores and loads again the same way, split or whole.
		whole := mustState(t, rec)
		split, err := MarshalStateWithoutKeys(rec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := UnmarshalStateWithKeys(split, SkippedKeys(rec))
		if err != nil || !bytes.Equal(mustState(t, again), whole) {
			t.Fatalf("split round trip: %v", err)
		}
	})
}

// TestStateVersion4IsUnsupported: a record of a later version is
// ErrUnsupportedVersion, not malformed.
func TestStateVersion4IsUnsupported(t *testing.T) {
	if _, err := UnmarshalState([]byte{0x84, 0x04, 0x80, 0xf6, 0x00}); !errors.Is(err, messages.ErrUnsupportedVersion) {
		t.Fatalf("version 4: %v", err)
	}
}
