package bolt

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/crypto/sealed"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// The layout-12 fixtures (testdata/layout_v12_delivery_bob_{sealed,plain}.db,
// layout_v12_delivery_alice_sealed.db) were written by ab878b4 through its
// own session managers (actors/session, the mesh clock at 2026-01-01),
// then compacted (bbolt.Compact), and are frozen: the sealed ones under
// fixtureV12Key. In each, bob.1 holds an established session with alice.1
// whose record carries the skipped keys of a0, a1 and a2 (alice sent a0…a3,
// bob received a3), and a session with carol.2 accepted from her second
// prekey envelope (c1), so it holds c0's skipped key. The envelopes of the
// four skipped messages are in layout_v12_delivery_{sealed,plain}.env, one
// "sender word hex" per line.
var fixtureV12Key = sealed.Key{0x12, 0x0c, 0x13}

var fxBob = messages.DeviceAddress{User: "bob", Device: 1}

// fixtureV12Now is inside the skipped keys' 30 days.
var fixtureV12Now = time.Date(2026, 1, 1, 1, 0, 0, 0, time.UTC)

type fixtureEnvelope struct {
	from messages.DeviceAddress
	want string
	env  []byte
}

func readFixtureEnvelopes(t *testing.T, variant string) []fixtureEnvelope {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "layout_v12_delivery_"+variant+".env"))
	if err != nil {
		t.Fatal(err)
	}
	var out []fixtureEnvelope
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("fixture line %q", line)
		}
		user, dev, _ := strings.Cut(f[0], ".")
		d, err := strconv.ParseUint(dev, 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		env, err := hex.DecodeString(f[2])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fixtureEnvelope{from: messages.DeviceAddress{User: user, Device: uint32(d)}, want: f[1], env: env})
	}
	return out
}

// rawSessions reads a file's layout version, the size of each stored
// session record and the number of stored skipped-key entries (-1: no
// such bucket).
func rawSessions(t *testing.T, path string) (version uint64, sizes map[string]int, skipped int) {
	t.Helper()
	raw, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	sizes = map[string]int{}
	skipped = -1
	if err := raw.View(func(tx *bbolt.Tx) error {
		if version, err = layoutVersion(wrapTx(tx)); err != nil {
			return err
		}
		if b := tx.Bucket(bucketDeliverySkipped); b != nil {
			skipped = b.Stats().KeyN
		}
		return tx.Bucket(bucketDeliverySessions).ForEach(func(k, v []byte) error {
			peer, err := parseAddrKey(k)
			if err != nil {
				return err
			}
			sizes[peer.String()] = len(v)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return version, sizes, skipped
}

// joinedRecord reads peer's record the way the session layer does: the
// state record and the skipped keys beside it.
func joinedRecord(t *testing.T, r persistence.DeliveryReader, peer messages.DeviceAddress) (state ratchet.SessionRecord, joined ratchet.SessionRecord) {
	t.Helper()
	raw, ok, err := r.Session(peer)
	if err != nil || !ok {
		t.Fatalf("session %s: %v %v", peer, ok, err)
	}
	if state, err = ratchet.UnmarshalState(raw); err != nil {
		t.Fatalf("session %s: %v", peer, err)
	}
	var keys []ratchet.SkippedKey
	if err := r.SkippedKeys(peer, func(seq uint64, entry []byte) (bool, error) {
		keys = append(keys, ratchet.SkippedKey{Seq: seq, Entry: entry})
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if joined, err = ratchet.UnmarshalStateWithKeys(raw, keys); err != nil {
		t.Fatalf("session %s with its keys: %v", peer, err)
	}
	return state, joined
}

// TestMigrateLayout12To13SplitsSkippedKeys: layout 13 moves every skipped
// key out of its session record into an entry of its own (sealed with the
// address and number in the associated data), with per-peer and device
// counts; the records shrink by their keys, and each of the four skipped
// messages of the frozen layout-12 file still decrypts with the record
// joined from the migrated state and entries. Reopening migrates nothing.
func TestMigrateLayout12To13SplitsSkippedKeys(t *testing.T) {
	s, err := sealed.New(fixtureV12Key)
	if err != nil {
		t.Fatal(err)
	}
	for name, sl := range map[string]persistence.Sealer{"sealed": s, "plain": nil} {
		t.Run(name, func(t *testing.T) {
			path := copyFixture(t, "layout_v12_delivery_bob_"+name+".db")
			v, before, skipped := rawSessions(t, path)
			if v != 12 || len(before) != 2 || skipped != -1 {
				t.Fatalf("fixture: layout %d, %d sessions, skipped bucket %d; want 12, 2, none", v, len(before), skipped)
			}
			envs := readFixtureEnvelopes(t, name)
			want := map[messages.DeviceAddress]int{fxAlice: 3, fxCarol: 1}
			check := func(db *DB) {
				t.Helper()
				if err := db.Delivery().View(context.Background(), func(r persistence.DeliveryReader) error {
					rawID, ok, err := r.LocalIdentity()
					if err != nil || !ok {
						t.Fatalf("identity: %v %v", ok, err)
					}
					id, err := ratchet.UnmarshalIdentity(rawID)
					if err != nil {
						t.Fatal(err)
					}
					recs := map[messages.DeviceAddress]ratchet.SessionRecord{}
					for p, n := range want {
						state, joined := joinedRecord(t, r, p)
						if state.SkippedKeyCount() != 0 || joined.SkippedKeyCount() != n {
							t.Fatalf("%s: %d keys in the state record, %d joined; want 0, %d", p, state.SkippedKeyCount(), joined.SkippedKeyCount(), n)
						}
						if c, err := r.SkippedKeyCount(&p); err != nil || c != n {
							t.Fatalf("SkippedKeyCount(%s) = %d %v, want %d", p, c, err, n)
						}
						recs[p] = joined
					}
					if c, err := r.SkippedKeyCount(nil); err != nil || c != 4 {
						t.Fatalf("SkippedKeyCount(nil) = %d %v, want 4", c, err)
					}
					for _, e := range envs {
						res, err := ratchet.Decrypt(recs[e.from], id, ratchet.PrekeyStore{}, e.env, ratchet.Route{From: e.from, To: fxBob}, fixtureV12Now)
						if err != nil || string(res.Plaintext) != e.want {
							t.Fatalf("skipped message %s of %s after the migration: %q %v", e.want, e.from, res.Plaintext, err)
						}
						recs[e.from] = res.Record
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			db := mustOpen(t, path, Options{NoSync: true, Sealer: sl})
			check(db)
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			v, after, skipped := rawSessions(t, path)
			if v != LayoutVersion || skipped != 4 {
				t.Fatalf("migrated: layout %d, %d skipped entries; want %d, 4", v, skipped, LayoutVersion)
			}
			for p, n := range want {
				// Each key left the record: 8 + 32 + 4 + 8 + 32 bytes
				// in the packed list of state version 2, minus the
				// number and the next number version 3 adds.
				if shrunk := before[p.String()] - after[p.String()]; shrunk < n*(32+4+8+32)-9 {
					t.Fatalf("record of %s: %d → %d bytes, not smaller by its %d keys", p, before[p.String()], after[p.String()], n)
				}
			}
			db = mustOpen(t, path, Options{NoSync: true, Sealer: sl})
			defer db.Close()
			check(db)
		})
	}
}

// TestMigrateLayout12To13RefusesAWrongKey: opened with another storage
// key, the migration fails before writing anything (the device identity
// does not open), Open returns ErrCorrupt and the file stays at layout 12
// with its records as they were; the right key then migrates it.
func TestMigrateLayout12To13RefusesAWrongKey(t *testing.T) {
	path := copyFixture(t, "layout_v12_delivery_bob_sealed.db")
	_, before, _ := rawSessions(t, path)
	wrong, err := sealed.New(sealed.Key{0x99})
	if err != nil {
		t.Fatal(err)
	}
	if db, err := Open(path, Options{NoSync: true, Sealer: wrong}); !errors.Is(err, persistence.ErrCorrupt) {
		if db != nil {
			_ = db.Close()
		}
		t.Fatalf("Open with a wrong key: %v, want ErrCorrupt", err)
	}
	v, after, skipped := rawSessions(t, path)
	if v != 12 || skipped != -1 || len(after) != len(before) {
		t.Fatalf("after the refused migration: layout %d, skipped bucket %d, %d sessions", v, skipped, len(after))
	}
	for k, n := range before {
		if after[k] != n {
			t.Fatalf("record %s changed by a refused migration: %d → %d bytes", k, n, after[k])
		}
	}
	right, err := sealed.New(fixtureV12Key)
	if err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, path, Options{NoSync: true, Sealer: right})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if v, _, skipped := rawSessions(t, path); v != LayoutVersion || skipped != 4 {
		t.Fatalf("with the right key: layout %d, %d skipped entries", v, skipped)
	}
}
