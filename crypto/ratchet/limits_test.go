package ratchet

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// lastResort returns a bundle of peer without its one-time prekey.
func lastResort(t testing.TB, peer *device) *messages.PrekeyBundle {
	t.Helper()
	b := peer.bundle(t)
	b.OneTimePrekey = nil
	return b
}

// initiateTo starts a fresh session of from with to (on an empty record)
// and returns its first envelope.
func initiateTo(t testing.TB, cfg Config, from, to *device, bundle *messages.PrekeyBundle, pt string) []byte {
	t.Helper()
	rec, _, err := cfg.Initiate(SessionRecord{}, from.id, bundle, routeOf(from, to))
	if err != nil {
		t.Fatal(err)
	}
	from.recs[to.name] = rec
	return from.send(t, cfg, to, []byte(pt))
}

// TestAcceptedInitiationsAtTheCap: at MaxAcceptedInitiations, a new
// last-resort initiation is refused (ErrInitiationLimit) and changes
// nothing, one with a one-time prekey still works; Refresh then rotates
// the signed prekey, closes the replaced one to last-resort initiations and
// empties the set, so a last-resort initiation to the new prekey works and
// no recorded one can come back.
func TestAcceptedInitiationsAtTheCap(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	pc := b.prekeys.Config()
	pc.MaxAcceptedInitiations = 3
	var err error
	if b.prekeys, err = b.prekeys.WithConfig(pc); err != nil {
		t.Fatal(err)
	}
	var recorded [][]byte
	for i := range 3 {
		env := initiateTo(t, cfg, a, b, lastResort(t, b), fmt.Sprint(i))
		b.recs["alice"] = SessionRecord{} // as ResetSession
		b.mustRecv(t, cfg, a, env, nil)
		recorded = append(recorded, env)
	}
	if n := b.prekeys.AcceptedCount(); n != 3 {
		t.Fatalf("accepted %d, want 3", n)
	}
	over := initiateTo(t, cfg, a, b, lastResort(t, b), "over")
	before := mustPrekeys(t, b.prekeys)
	b.recs["alice"] = SessionRecord{}
	if _, err := b.recv(cfg, a, over, t0); !errors.Is(err, ErrInitiationLimit) {
		t.Fatalf("last-resort initiation past the cap: %v, want ErrInitiationLimit", err)
	}
	if !bytes.Equal(before, mustPrekeys(t, b.prekeys)) || !b.recs["alice"].IsEmpty() {
		t.Fatal("a refused initiation changed state")
	}
	b.mustRecv(t, cfg, a, initiateTo(t, cfg, a, b, b.bundle(t), "with otpk"), []byte("with otpk"))

	old := b.prekeys.CurrentSignedPrekeyID()
	pk, changed, err := b.prekeys.Refresh(b.id, t0)
	if err != nil || !changed || pk.CurrentSignedPrekeyID() == old || pk.AcceptedCount() != 0 {
		t.Fatalf("refresh at the cap: changed %v, rotated %v, accepted %d, %v", changed, pk.CurrentSignedPrekeyID() != old, pk.AcceptedCount(), err)
	}
	// The state survives a restart.
	if b.prekeys, err = UnmarshalPrekeyStore(mustPrekeys(t, pk)); err != nil {
		t.Fatal(err)
	}
	for i, env := range append(recorded, over) {
		b.recs["alice"] = SessionRecord{}
		if _, err := b.recv(cfg, a, env, t0); !errors.Is(err, ErrInitiationLimit) {
			t.Fatalf("recorded initiation %d against the closed prekey: %v", i, err)
		}
	}
	b.recs["alice"] = SessionRecord{}
	b.mustRecv(t, cfg, a, initiateTo(t, cfg, a, b, lastResort(t, b), "new prekey"), []byte("new prekey"))
	if n := b.prekeys.AcceptedCount(); n != 1 {
		t.Fatalf("accepted %d after rotation, want 1", n)
	}
}

// TestAcceptedInitiationsExpireWithTheirPrekeys: an accepted id is kept
// while its prekeys are held and dropped by the Refresh that forgets them.
func TestAcceptedInitiationsExpireWithTheirPrekeys(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	env := initiateTo(t, cfg, a, b, lastResort(t, b), "x")
	b.mustRecv(t, cfg, a, env, nil)
	pc := b.prekeys.Config()
	rotated := t0.Add(pc.RotationInterval)
	pk, _, err := b.prekeys.Refresh(b.id, rotated)
	if err != nil || pk.AcceptedCount() != 1 {
		t.Fatalf("after rotation (in grace): accepted %d, %v", pk.AcceptedCount(), err)
	}
	b.prekeys = pk
	b.recs["alice"] = SessionRecord{}
	if _, err := b.recv(cfg, a, env, rotated); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay in the grace period: %v", err)
	}
	expired := rotated.Add(pc.GracePeriod)
	if pk, _, err = b.prekeys.Refresh(b.id, expired); err != nil || pk.AcceptedCount() != 0 {
		t.Fatalf("after the grace period: accepted %d, %v", pk.AcceptedCount(), err)
	}
	b.prekeys = pk
	if _, err := b.recv(cfg, a, env, expired); !errors.Is(err, ErrUnknownPrekey) {
		t.Fatalf("replay after its prekeys expired: %v", err)
	}
}

// TestAcceptIsAppliedOnceAtCommit: Decrypt works on a snapshot; the
// stored store refuses a second application of one initiation, so two
// concurrent copies are never both accepted.
func TestAcceptIsAppliedOnceAtCommit(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	for _, bundle := range []*messages.PrekeyBundle{lastResort(t, b), b.bundle(t)} {
		env := initiateTo(t, cfg, a, b, bundle, "x")
		snapshot := b.prekeys
		r1, err := cfg.Decrypt(SessionRecord{}, b.id, snapshot, env, routeOf(a, b), t0)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := cfg.Decrypt(SessionRecord{}, b.id, snapshot, env, routeOf(a, b), t0)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := snapshot.Accept(*r1.Accepted)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stored.Accept(*r2.Accepted); !errors.Is(err, ErrReplay) && !errors.Is(err, ErrUnknownPrekey) {
			t.Fatalf("second acceptance of one initiation: %v", err)
		}
		b.prekeys = stored
	}
}

// TestPreAuthenticationJumpCaps: N and PN + N of a prekey envelope, and
// of an answer on a session we initiated, are capped by
// MaxUnacknowledgedJump at and past the edge — and the prekey check comes
// first, before any prekey is looked up.
func TestPreAuthenticationJumpCaps(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxUnacknowledgedJump = 8
	jumped := func(t *testing.T, from, to *device, skip uint32) []byte {
		t.Helper()
		rec, _, err := cfg.Initiate(SessionRecord{}, from.id, to.bundle(t), routeOf(from, to))
		if err != nil {
			t.Fatal(err)
		}
		s := *rec.sessions[0]
		s.cks, _ = skipKeys(s.cks, s.dhsPub, 0, skip, 0, 0)
		s.ns = skip
		from.recs[to.name] = rec.withReplaced(0, &s)
		return from.send(t, cfg, to, []byte("j"))
	}
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	if _, err := cfg.Decrypt(SessionRecord{}, b.id, PrekeyStore{}, jumped(t, a, b, 9), routeOf(a, b), t0); !errors.Is(err, ErrTooManySkipped) {
		t.Fatalf("prekey envelope with N = cap + 1 (no prekeys given): %v, want ErrTooManySkipped before any lookup", err)
	}
	b.mustRecv(t, cfg, a, jumped(t, a, b, 8), []byte("j"))
	// Still unanswered, alice's later envelopes carry the initiation: the
	// jump from bob's receiving chain is capped too.
	for range 9 {
		a.send(t, cfg, b, []byte("lost"))
	}
	if _, err := b.recv(cfg, a, a.send(t, cfg, b, []byte("far")), t0); !errors.Is(err, ErrTooManySkipped) {
		t.Fatalf("prekey envelope 10 ahead on a held session: %v", err)
	}
	// Once answered, the ordinary MaxForwardJump applies.
	a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("ack")), []byte("ack"))
	for range 20 {
		a.send(t, cfg, b, []byte("lost"))
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("ok")), []byte("ok"))

	// An answer on a session alice initiated and bob never answered: a
	// forged one cannot make alice walk more than the cap either (here a
	// genuine one from bob's side, jumped past it).
	c, d := newDevice(t, "carol"), newDevice(t, "dave")
	d.mustRecv(t, cfg, c, initiateTo(t, cfg, c, d, d.bundle(t), "hi"), []byte("hi"))
	var answers [][]byte
	for i := range 10 {
		answers = append(answers, d.send(t, cfg, c, fmt.Appendf(nil, "%d", i)))
	}
	if _, err := c.recv(cfg, d, answers[9], t0); !errors.Is(err, ErrTooManySkipped) {
		t.Fatalf("answer 9 ahead on an unanswered session: %v", err)
	}
	c.mustRecv(t, cfg, d, answers[8], []byte("8")) // 8 ahead: at the cap
}

// TestSkippedKeysExpireByAge: a skipped key older than MaxSkippedKeyAge is
// gone at the next step; a younger one still decrypts.
func TestSkippedKeysExpireByAge(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxSkippedKeyAge = time.Hour
	a, b := established(t, cfg)
	e0, e1 := a.send(t, cfg, b, []byte("0")), a.send(t, cfg, b, []byte("1"))
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("2")), []byte("2")) // 0 and 1 skipped at t0
	if _, err := b.recv(cfg, a, e1, t0.Add(time.Hour)); err != nil {
		t.Fatalf("skipped key at its age limit: %v", err)
	}
	if _, err := b.recv(cfg, a, a.send(t, cfg, b, []byte("3")), t0.Add(time.Hour+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.recv(cfg, a, e0, t0.Add(time.Hour+2)); !errors.Is(err, ErrReplay) {
		t.Fatalf("skipped key past its age: %v, want ErrReplay", err)
	}
}

// TestSkippedKeysPerRecordCap: the sessions of one record hold at most
// MaxSkippedKeysPerRecord keys together, at and past the edge; the oldest
// session's keys go first.
func TestSkippedKeysPerRecordCap(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxSkippedKeysPerRecord = 10
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	count := func() int {
		n := 0
		for _, s := range b.recs["alice"].sessions {
			n += len(s.skipped)
		}
		return n
	}
	first := initiateTo(t, cfg, a, b, b.bundle(t), "s0")
	var lateOld []byte
	for i := range 6 {
		e := a.send(t, cfg, b, []byte("late"))
		if i == 0 {
			lateOld = e
		}
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("x")), nil) // establishes, skips 7 (0..6)
	if n := count(); n != 7 {
		t.Fatalf("%d skipped keys, want 7", n)
	}
	_ = first
	// A second session of alice skipping 3: exactly at the cap.
	initiateTo(t, cfg, a, b, b.bundle(t), "t0")
	a.send(t, cfg, b, []byte("t1"))
	a.send(t, cfg, b, []byte("t2"))
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("t3")), []byte("t3"))
	if n := count(); n != 10 {
		t.Fatalf("%d skipped keys at the cap, want 10", n)
	}
	b.mustRecv(t, cfg, a, lateOld, []byte("late")) // the old session's keys are all still there
	// Past the cap: a third session skipping 5 evicts the oldest session's keys first.
	initiateTo(t, cfg, a, b, b.bundle(t), "u0")
	for range 4 {
		a.send(t, cfg, b, []byte("u"))
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("u5")), []byte("u5"))
	if n := count(); n != 10 {
		t.Fatalf("%d skipped keys past the cap, want 10", n)
	}
	// 6 + 3 + 5 = 14 keys: the 4 over the cap came from the oldest session.
	sess := b.recs["alice"].sessions
	if got := []int{len(sess[0].skipped), len(sess[1].skipped), len(sess[2].skipped)}; got[0] != 5 || got[1] != 3 || got[2] != 2 {
		t.Fatalf("skipped keys per session (newest first) %v, want [5 3 2]", got)
	}
}

// TestVersion1StateAndPrekeysLoad: records and prekey stores of the
// previous layout decode; skipped keys of a version-1 record still open
// their message, and a version-1 prekey store accepts initiations.
func TestVersion1StateAndPrekeysLoad(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	late := a.send(t, cfg, b, []byte("late"))
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("x")), nil)
	rec, err := UnmarshalState(stateV1(t, b.recs["alice"]))
	if err != nil {
		t.Fatal(err)
	}
	b.recs["alice"] = rec
	b.mustRecv(t, cfg, a, late, []byte("late"))
	pk, err := UnmarshalPrekeyStore(prekeysV1(t, b.prekeys))
	if err != nil {
		t.Fatal(err)
	}
	if pk.AcceptedCount() != 0 || pk.OneTimeCount() != b.prekeys.OneTimeCount() || pk.CurrentSignedPrekeyID() != b.prekeys.CurrentSignedPrekeyID() {
		t.Fatal("version-1 prekey store decoded differently")
	}
	b.prekeys = pk
	c := newDevice(t, "carol")
	b.mustRecv(t, cfg, c, initiateTo(t, cfg, c, b, lastResort(t, b), "on v1 prekeys"), []byte("on v1 prekeys"))
}

// BenchmarkHostilePrekeyEnvelope is the cost of one prekey envelope that
// jumps its first chain 25 000 ahead (measured at 24–33 ms
// without the cap); it is refused before any DH.
func BenchmarkHostilePrekeyEnvelope(b *testing.B) {
	cfg := DefaultConfig()
	bob, mallory := newDevice(b, "bob"), newDevice(b, "mallory")
	rec, _, err := cfg.Initiate(SessionRecord{}, mallory.id, bob.bundle(b), routeOf(mallory, bob))
	if err != nil {
		b.Fatal(err)
	}
	s := *rec.sessions[0]
	s.cks, _ = skipKeys(s.cks, s.dhsPub, 0, 25_000, 0, 0)
	s.ns = 25_000
	mallory.recs[bob.name] = rec.withReplaced(0, &s)
	env := mallory.send(b, cfg, bob, []byte("x"))
	for b.Loop() {
		if _, err := cfg.Decrypt(SessionRecord{}, bob.id, bob.prekeys, env, routeOf(mallory, bob), t0); !errors.Is(err, ErrTooManySkipped) {
			b.Fatal(err)
		}
	}
}

// BenchmarkForgedSignatureInitiation is the cost of a prekey envelope at
// the jump cap whose initiation signature does not verify: refused after
// the signature check, before any DH or KEM.
func BenchmarkForgedSignatureInitiation(b *testing.B) {
	cfg := DefaultConfig()
	bob, mallory, victim := newDevice(b, "bob"), newDevice(b, "mallory"), newDevice(b, "victim")
	forged := mallory.id
	forged.pub.Sign = victim.id.Public().Sign
	rec, _, err := cfg.Initiate(SessionRecord{}, forged, bob.bundle(b), routeOf(mallory, bob))
	if err != nil {
		b.Fatal(err)
	}
	s := *rec.sessions[0]
	s.cks, _ = skipKeys(s.cks, s.dhsPub, 0, uint32(cfg.MaxUnacknowledgedJump), 0, 0)
	s.ns = uint32(cfg.MaxUnacknowledgedJump)
	mallory.recs[bob.name] = rec.withReplaced(0, &s)
	env := mallory.send(b, cfg, bob, []byte("x"))
	for b.Loop() {
		if _, err := cfg.Decrypt(SessionRecord{}, bob.id, bob.prekeys, env, routeOf(mallory, bob), t0); !errors.Is(err, ErrTampered) {
			b.Fatal(err)
		}
	}
}
