package ratchet

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

func TestConversationAndAcknowledgement(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	info := a.initiate(t, cfg, b)
	if !info.Initiator || info.Acknowledged || info.Remote != b.id.Public() {
		t.Fatalf("initiator info %+v", info)
	}
	e1 := a.send(t, cfg, b, []byte("one"))
	e2 := a.send(t, cfg, b, []byte("two"))
	for _, e := range [][]byte{e1, e2} {
		env, err := messages.DecodeEnvelope(e)
		if err != nil || env.Initiation == nil {
			t.Fatalf("pre-ack envelope must carry the initiation: %v", err)
		}
	}
	// Out of order from the very first message: e2 establishes the session.
	res := b.mustRecv(t, cfg, a, e2, []byte("two"))
	if !res.Established || !res.Current || res.Session.Remote != a.id.Public() || res.Session.ID != info.ID {
		t.Fatalf("responder result %+v", res.Session)
	}
	if !res.PrekeysChanged {
		t.Fatal("a one-time prekey was used, the store must change")
	}
	res = b.mustRecv(t, cfg, a, e1, []byte("one"))
	if res.Established {
		t.Fatal("second prekey envelope of a known session must not re-establish it")
	}
	a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("three")), []byte("three"))
	if cur, _ := a.recs["bob"].Current(); !cur.Acknowledged {
		t.Fatal("session not acknowledged after the peer answered")
	}
	env, err := messages.DecodeEnvelope(a.send(t, cfg, b, []byte("four")))
	if err != nil || env.Initiation != nil {
		t.Fatalf("post-ack envelope must not carry the initiation (%v)", err)
	}
}

// delivery simulates one direction of a lossy-order transport.
type flight struct {
	env []byte
	idx int
}

func TestThousandMessagesEachWayReordered(t *testing.T) {
	cfg := DefaultConfig()
	const perSide, window = 1000, 64
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			a, b := established(t, cfg)
			type side struct {
				self, peer *device
				sent       int
				inflight   []flight // envelopes from peer to self
				got        map[int]bool
				delivered  [][]byte
			}
			sa := &side{self: a, peer: b, got: map[int]bool{}}
			sb := &side{self: b, peer: a, got: map[int]bool{}}
			sa.peer, sb.peer = b, a
			for len(sa.got) < perSide || len(sb.got) < perSide {
				from, to := sa, sb
				if rng.IntN(2) == 0 {
					from, to = sb, sa
				}
				if rng.IntN(2) == 0 && from.sent < perSide {
					pt := fmt.Appendf(nil, "%s #%d", from.self.name, from.sent)
					to.inflight = append(to.inflight, flight{from.self.send(t, cfg, to.self, pt), from.sent})
					from.sent++
					continue
				}
				if len(to.inflight) == 0 {
					continue
				}
				i := rng.IntN(min(window, len(to.inflight)))
				f := to.inflight[i]
				to.inflight = append(to.inflight[:i], to.inflight[i+1:]...)
				res := to.self.mustRecv(t, cfg, from.self, f.env, fmt.Appendf(nil, "%s #%d", from.self.name, f.idx))
				_ = res
				if to.got[f.idx] {
					t.Fatalf("%s got #%d twice", to.self.name, f.idx)
				}
				to.got[f.idx] = true
				to.delivered = append(to.delivered, f.env)
				// Replays: the one just delivered must be ErrReplay; an older
				// one must fail too, without changing anything.
				if rng.IntN(10) == 0 {
					before := mustState(t, to.self.recs[from.self.name])
					if _, err := to.self.recv(cfg, from.self, f.env, t0); !errors.Is(err, ErrReplay) {
						t.Fatalf("immediate replay: %v, want ErrReplay", err)
					}
					old := to.delivered[rng.IntN(len(to.delivered))]
					if _, err := to.self.recv(cfg, from.self, old, t0); !errors.Is(err, ErrReplay) && !errors.Is(err, ErrTampered) {
						t.Fatalf("old replay: %v", err)
					}
					if !bytes.Equal(before, mustState(t, to.self.recs[from.self.name])) {
						t.Fatal("a rejected replay changed the state")
					}
				}
			}
		})
	}
}

func TestReplayRejected(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	// In the current chain.
	e0 := a.send(t, cfg, b, []byte("m0"))
	e1 := a.send(t, cfg, b, []byte("m1"))
	e2 := a.send(t, cfg, b, []byte("m2"))
	b.mustRecv(t, cfg, a, e0, nil)
	b.mustRecv(t, cfg, a, e2, nil) // e1 becomes a skipped key
	b.mustRecv(t, cfg, a, e1, nil) // skipped key used and deleted
	for i, e := range [][]byte{e0, e1, e2} {
		before := mustState(t, b.recs["alice"])
		if _, err := b.recv(cfg, a, e, t0); !errors.Is(err, ErrReplay) || !errors.Is(err, ErrDuplicateMessage) {
			t.Fatalf("replay %d: %v", i, err)
		}
		if !bytes.Equal(before, mustState(t, b.recs["alice"])) {
			t.Fatal("state changed")
		}
	}
	// After a DH ratchet turn the old chain's messages are still replays.
	a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("turn")), nil)
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("new chain")), nil)
	if _, err := b.recv(cfg, a, e1, t0); !errors.Is(err, ErrReplay) {
		t.Fatalf("previous-chain replay: %v", err)
	}
}

func TestReplayedInitiationAfterEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxArchivedSessions = 1
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	var first []byte
	for i := range 3 {
		a.recs["bob"] = SessionRecord{} // alice reinstalls, same identity
		a.initiate(t, cfg, b)
		e := a.send(t, cfg, b, []byte("x"))
		if i == 0 {
			first = e
		}
		b.mustRecv(t, cfg, a, e, nil)
	}
	if n := len(b.recs["alice"].Sessions()); n != 2 {
		t.Fatalf("archive not bounded: %d sessions", n)
	}
	if _, err := b.recv(cfg, a, first, t0); !errors.Is(err, ErrReplay) {
		t.Fatalf("replayed initiation of an evicted session: %v", err)
	}
}

func flipEveryBit(t *testing.T, cfg Config, rx, tx *device, env, want []byte) {
	t.Helper()
	recBefore := mustState(t, rx.recs[tx.name])
	pkBefore := mustPrekeys(t, rx.prekeys)
	for i := range env {
		for bit := range 8 {
			mut := bytes.Clone(env)
			mut[i] ^= 1 << bit
			res, err := cfg.Decrypt(rx.recs[tx.name], rx.id, rx.prekeys, mut, routeOf(tx, rx), t0)
			if err == nil {
				t.Fatalf("flip of byte %d bit %d accepted: %q", i, bit, res.Plaintext)
			}
			if res.Plaintext != nil || !res.Record.IsEmpty() {
				t.Fatal("an error result must be the zero value")
			}
		}
	}
	if !bytes.Equal(recBefore, mustState(t, rx.recs[tx.name])) || !bytes.Equal(pkBefore, mustPrekeys(t, rx.prekeys)) {
		t.Fatal("rejected envelopes changed the state")
	}
	rx.mustRecv(t, cfg, tx, env, want) // the genuine envelope still works
}

func TestBitFlipsRejectedWithoutStateChange(t *testing.T) {
	cfg := DefaultConfig()
	t.Run("prekey envelope", func(t *testing.T) {
		a, b := newDevice(t, "alice"), newDevice(t, "bob")
		a.initiate(t, cfg, b)
		flipEveryBit(t, cfg, b, a, a.send(t, cfg, b, []byte("first")), []byte("first"))
	})
	t.Run("ratchet envelope", func(t *testing.T) {
		a, b := established(t, cfg)
		flipEveryBit(t, cfg, b, a, a.send(t, cfg, b, []byte("same chain")), []byte("same chain"))
		// A DH ratchet step pending on the receiver.
		flipEveryBit(t, cfg, a, b, b.send(t, cfg, a, []byte("new chain")), []byte("new chain"))
	})
}

func TestIdentityPinning(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	mallory := newDevice(t, "mallory")
	if err := CheckPin(a.id.Public(), a.id.Public()); err != nil {
		t.Fatal(err)
	}
	err := CheckPin(a.id.Public(), mallory.id.Public())
	var ice *IdentityChangedError
	if !errors.As(err, &ice) || ice.Pinned != a.id.Public() || ice.Seen != mallory.id.Public() {
		t.Fatalf("CheckPin: %v", err)
	}
	// Mallory initiates to bob; bob delivers it into alice's record.
	mallory.initiate(t, cfg, b)
	env := mallory.send(t, cfg, b, []byte("i am alice"))
	before := mustState(t, b.recs["alice"])
	if _, err := cfg.Decrypt(b.recs["alice"], b.id, b.prekeys, env, Route{From: a.addr(), To: b.addr()}, t0); !errors.Is(err, ErrWrongAddress) {
		t.Fatalf("mallory's initiation delivered as alice's: %v, want ErrWrongAddress", err)
	}
	// Mallory names alice's address in her initiation: the pin refuses it.
	rec, _, err := cfg.Initiate(SessionRecord{}, mallory.id, b.bundle(t), Route{From: a.addr(), To: b.addr()})
	if err != nil {
		t.Fatal(err)
	}
	_, env, err = cfg.Encrypt(rec, []byte("i am alice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Decrypt(b.recs["alice"], b.id, b.prekeys, env, Route{From: a.addr(), To: b.addr()}, t0); !errors.As(err, &ice) {
		t.Fatalf("initiation from another identity: %v", err)
	}
	if !bytes.Equal(before, mustState(t, b.recs["alice"])) {
		t.Fatal("state changed")
	}
	// Initiating with another identity's bundle on a pinned record.
	if _, _, err := cfg.Initiate(a.recs["bob"], a.id, mallory.bundle(t), routeOf(a, b)); !errors.As(err, &ice) {
		t.Fatalf("Initiate on a pinned record: %v", err)
	}
	// The remote identity is exposed for pinning.
	if r, ok := b.recs["alice"].RemoteIdentity(); !ok || r != a.id.Public() {
		t.Fatal("RemoteIdentity")
	}
}

func TestSessionReplacementBySamePinnedIdentity(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	old, _ := b.recs["alice"].Current()
	late := a.send(t, cfg, b, []byte("late on old session"))
	a.recs["bob"] = SessionRecord{} // alice lost her sessions, kept her identity
	info := a.initiate(t, cfg, b)
	res := b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("fresh")), []byte("fresh"))
	if !res.Established || !res.Current || res.Session.ID != info.ID {
		t.Fatalf("fresh initiation did not replace the session: %+v", res)
	}
	ss := b.recs["alice"].Sessions()
	if len(ss) != 2 || ss[1].ID != old.ID {
		t.Fatal("old session not archived")
	}
	if res := b.mustRecv(t, cfg, a, late, []byte("late on old session")); res.Current {
		t.Fatal("archived session reported current")
	}
	a.mustRecv(t, cfg, b, b.send(t, cfg, a, []byte("reply")), []byte("reply"))
}

func TestOneTimePrekeyReuseRefused(t *testing.T) {
	cfg := DefaultConfig()
	a, b, c := newDevice(t, "alice"), newDevice(t, "bob"), newDevice(t, "carol")
	bundle := b.bundle(t)
	if bundle.OneTimePrekey == nil {
		t.Fatal("bundle without one-time prekey")
	}
	otpk := bundle.OneTimePrekey.ID
	for _, d := range []*device{a, c} {
		rec, _, err := cfg.Initiate(SessionRecord{}, d.id, bundle, routeOf(d, b))
		if err != nil {
			t.Fatal(err)
		}
		d.recs["bob"] = rec
	}
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("a")), nil)
	if b.prekeys.HasOneTime(otpk) {
		t.Fatal("one-time prekey not removed on use")
	}
	before := mustPrekeys(t, b.prekeys)
	_, err := b.recv(cfg, c, c.send(t, cfg, b, []byte("c")), t0)
	if !errors.Is(err, ErrUnknownPrekey) {
		t.Fatalf("second session with the same one-time prekey: %v", err)
	}
	if !bytes.Equal(before, mustPrekeys(t, b.prekeys)) {
		t.Fatal("state changed")
	}
	// Bundles hand out distinct one-time prekeys.
	if nb := b.bundle(t); nb.OneTimePrekey == nil || nb.OneTimePrekey.ID == otpk {
		t.Fatal("IssueBundle reissued a one-time prekey")
	}
}

func TestSignedPrekeyRotationAndGrace(t *testing.T) {
	cfg := DefaultConfig()
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	oldBundle := b.bundle(t)
	pcfg := b.prekeys.Config()
	pk, changed, err := b.prekeys.Refresh(b.id, t0.Add(pcfg.RotationInterval-time.Second))
	if err != nil || changed {
		t.Fatalf("refresh before the rotation time: changed=%v %v", changed, err)
	}
	rotatedAt := t0.Add(pcfg.RotationInterval)
	pk, changed, err = pk.Refresh(b.id, rotatedAt)
	if err != nil || !changed || pk.CurrentSignedPrekeyID() == oldBundle.SignedPrekey.ID {
		t.Fatalf("rotation: changed=%v %v", changed, err)
	}
	b.prekeys = pk
	if nb := b.bundle(t); nb.SignedPrekey.ID == oldBundle.SignedPrekey.ID || nb.KEMPrekey.ID == oldBundle.KEMPrekey.ID {
		t.Fatal("new bundle still names the old prekeys")
	}
	rec, _, err := cfg.Initiate(SessionRecord{}, a.id, oldBundle, routeOf(a, b))
	if err != nil {
		t.Fatal(err)
	}
	rec, env, err := cfg.Encrypt(rec, []byte("late initiator"))
	if err != nil {
		t.Fatal(err)
	}
	_ = rec
	inGrace := rotatedAt.Add(pcfg.GracePeriod - time.Nanosecond)
	if _, err := cfg.Decrypt(SessionRecord{}, b.id, b.prekeys, env, routeOf(a, b), inGrace); err != nil {
		t.Fatalf("old signed prekey inside the grace period: %v", err)
	}
	after := rotatedAt.Add(pcfg.GracePeriod)
	if _, err := cfg.Decrypt(SessionRecord{}, b.id, b.prekeys, env, routeOf(a, b), after); !errors.Is(err, ErrUnknownPrekey) {
		t.Fatalf("old signed prekey after the grace period: %v", err)
	}
	pk, changed, err = b.prekeys.Refresh(b.id, after)
	if err != nil || !changed {
		t.Fatalf("refresh after grace: %v %v", changed, err)
	}
	for _, id := range pk.SignedPrekeyIDs() {
		if id == oldBundle.SignedPrekey.ID {
			t.Fatalf("expired prekey not forgotten: %v", pk.SignedPrekeyIDs())
		}
	}
}

func TestOneTimePrekeyReplenishment(t *testing.T) {
	b := newDevice(t, "bob") // batch 10, threshold 3, max 40
	if got := b.prekeys.UnissuedOneTimeCount(); got != 10 {
		t.Fatalf("initial batch %d", got)
	}
	for range 8 {
		b.bundle(t)
	}
	if got := b.prekeys.UnissuedOneTimeCount(); got != 2 {
		t.Fatalf("unissued %d", got)
	}
	pk, changed, err := b.prekeys.Refresh(b.id, t0)
	if err != nil || !changed || pk.UnissuedOneTimeCount() != 12 || pk.OneTimeCount() != 20 {
		t.Fatalf("replenish: changed=%v err=%v unissued=%d total=%d", changed, err, pk.UnissuedOneTimeCount(), pk.OneTimeCount())
	}
	if _, changed, _ := pk.Refresh(b.id, t0); changed {
		t.Fatal("refresh above the threshold changed the store")
	}
	// The cap drops the oldest issued keys.
	b.prekeys = pk
	for range 60 {
		b.bundle(t)
		if pk, _, err = b.prekeys.Refresh(b.id, t0); err != nil {
			t.Fatal(err)
		}
		b.prekeys = pk
	}
	if n := b.prekeys.OneTimeCount(); n > 40 {
		t.Fatalf("one-time prekeys over the cap: %d", n)
	}
	// Bundles without one-time prekeys still work (last resort).
	cfg := DefaultConfig()
	a := newDevice(t, "alice")
	pk2, bundle, _ := b.prekeys.IssueBundle(b.id.Public())
	_ = pk2
	bundle.OneTimePrekey = nil
	rec, _, err := cfg.Initiate(SessionRecord{}, a.id, &bundle, routeOf(a, b))
	if err != nil {
		t.Fatal(err)
	}
	_, env, _ := cfg.Encrypt(rec, []byte("no otpk"))
	res, err := cfg.Decrypt(SessionRecord{}, b.id, b.prekeys, env, routeOf(a, b), t0)
	if err != nil || string(res.Plaintext) != "no otpk" {
		t.Fatalf("last-resort initiation: %v", err)
	}
	// It consumed no one-time prekey but is remembered as accepted.
	if !res.PrekeysChanged || res.Prekeys.OneTimeCount() != b.prekeys.OneTimeCount() || res.Prekeys.AcceptedCount() != b.prekeys.AcceptedCount()+1 {
		t.Fatalf("last-resort initiation: changed %v, one-time %d → %d, accepted %d → %d", res.PrekeysChanged,
			b.prekeys.OneTimeCount(), res.Prekeys.OneTimeCount(), b.prekeys.AcceptedCount(), res.Prekeys.AcceptedCount())
	}
}

func TestBadPrekeySignatureRefused(t *testing.T) {
	a, b := newDevice(t, "alice"), newDevice(t, "bob")
	good := b.bundle(t)
	mutations := map[string]func(*messages.PrekeyBundle){
		"spk signature": func(x *messages.PrekeyBundle) { x.SignedPrekey.Signature[3] ^= 1 },
		"spk public":    func(x *messages.PrekeyBundle) { x.SignedPrekey.Public[0] ^= 1 },
		"spk id":        func(x *messages.PrekeyBundle) { x.SignedPrekey.ID++ },
		"kem signature": func(x *messages.PrekeyBundle) { x.KEMPrekey.Signature[60] ^= 1 },
		"kem public":    func(x *messages.PrekeyBundle) { x.KEMPrekey.Public[100] ^= 1 },
		"identity dh":   func(x *messages.PrekeyBundle) { x.Identity.DH[5] ^= 1 },
		"identity sign": func(x *messages.PrekeyBundle) { x.Identity.Sign[5] ^= 1 },
	}
	for name, mut := range mutations {
		bad := *good
		bad.KEMPrekey.Public = bytes.Clone(good.KEMPrekey.Public)
		mut(&bad)
		if _, _, err := Initiate(SessionRecord{}, a.id, &bad, routeOf(a, b)); !errors.Is(err, ErrBadPrekeySignature) {
			t.Errorf("%s: %v, want ErrBadPrekeySignature", name, err)
		}
	}
	if err := VerifyBundle(good); err != nil {
		t.Fatal(err)
	}
}

func TestStateSurvivesSerialization(t *testing.T) {
	cfg := DefaultConfig()
	a := newDevice(t, "alice")
	b := newDevice(t, "bob")
	a.initiate(t, cfg, b)
	// Restart alice with a pending (unacknowledged) initiation.
	restart := func(d *device, peer string) {
		enc := mustState(t, d.recs[peer])
		rec, err := UnmarshalState(enc)
		if err != nil {
			t.Fatal(err)
		}
		if again := mustState(t, rec); !bytes.Equal(enc, again) {
			t.Fatal("state encoding is not deterministic across a round trip")
		}
		d.recs[peer] = rec
		pk, err := UnmarshalPrekeyStore(mustPrekeys(t, d.prekeys))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustPrekeys(t, pk), mustPrekeys(t, d.prekeys)) {
			t.Fatal("prekey store round trip")
		}
		d.prekeys = pk
		ib, err := MarshalIdentity(d.id)
		if err != nil {
			t.Fatal(err)
		}
		id, err := UnmarshalIdentity(ib)
		if err != nil || id.Public() != d.id.Public() {
			t.Fatalf("identity round trip: %v", err)
		}
		d.id = id
	}
	restart(a, "bob")
	e := [][]byte{a.send(t, cfg, b, []byte("0")), a.send(t, cfg, b, []byte("1")), a.send(t, cfg, b, []byte("2"))}
	b.mustRecv(t, cfg, a, e[2], []byte("2")) // 0 and 1 are skipped keys now
	restart(b, "alice")
	b.mustRecv(t, cfg, a, e[0], []byte("0"))
	reply := b.send(t, cfg, a, []byte("r"))
	restart(b, "alice")
	a.mustRecv(t, cfg, b, reply, []byte("r"))
	restart(a, "bob")
	b.mustRecv(t, cfg, a, e[1], []byte("1"))
	b.mustRecv(t, cfg, a, a.send(t, cfg, b, []byte("after")), []byte("after"))
	if _, err := b.recv(cfg, a, e[1], t0); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay after restart: %v", err)
	}
}

func TestTooManySkippedAndEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxForwardJump, cfg.MaxSkippedKeys = 10, 4
	a, b := established(t, cfg)
	var envs [][]byte
	for i := range 12 {
		envs = append(envs, a.send(t, cfg, b, fmt.Appendf(nil, "%d", i)))
	}
	before := mustState(t, b.recs["alice"])
	if _, err := b.recv(cfg, a, envs[11], t0); !errors.Is(err, ErrTooManySkipped) {
		t.Fatalf("jump of 11: %v", err)
	}
	if !bytes.Equal(before, mustState(t, b.recs["alice"])) {
		t.Fatal("state changed")
	}
	b.mustRecv(t, cfg, a, envs[8], []byte("8")) // skips 0..7, keeps 4..7
	for i := 4; i < 8; i++ {
		b.mustRecv(t, cfg, a, envs[i], fmt.Appendf(nil, "%d", i))
	}
	if _, err := b.recv(cfg, a, envs[0], t0); !errors.Is(err, ErrReplay) {
		t.Fatalf("evicted key: %v", err)
	}
	b.mustRecv(t, cfg, a, envs[11], []byte("11"))
}

func TestUnknownSessionAndMalformed(t *testing.T) {
	cfg := DefaultConfig()
	a, b := established(t, cfg)
	c := newDevice(t, "carol")
	if _, _, err := cfg.Encrypt(SessionRecord{}, []byte("x")); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("encrypt on empty record: %v", err)
	}
	env := a.send(t, cfg, b, []byte("for bob"))
	if _, err := c.recv(cfg, a, env, t0); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("unknown session: %v", err)
	}
	if _, err := b.recv(cfg, a, []byte{0x01, 0x02}, t0); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("garbage: %v", err)
	}
	if _, err := UnmarshalState([]byte{0x83, 0x01, 0x80, 0x41, 0x00}); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("state garbage: %v", err)
	}
	if _, err := UnmarshalState([]byte{0x83, 0x03, 0x80, 0xf6}); !errors.Is(err, messages.ErrUnsupportedVersion) {
		t.Fatalf("state version: %v", err)
	}
	if _, err := UnmarshalPrekeyStore([]byte{0xa0}); !errors.Is(err, messages.ErrMalformed) {
		t.Fatalf("prekey garbage: %v", err)
	}
	if err := (Config{}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal("zero config accepted")
	}
}

// TestSimultaneousInitiation: both devices initiate at once and send while
// the initiations cross; every message decrypts exactly once on both sides
// and both end on the same current session (the smaller id).
func TestSimultaneousInitiation(t *testing.T) {
	cfg := DefaultConfig()
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			a, b := newDevice(t, "alice"), newDevice(t, "bob")
			ia := a.initiate(t, cfg, b)
			ib := b.initiate(t, cfg, a)
			winner := ia.ID
			if bytes.Compare(ib.ID[:], ia.ID[:]) < 0 {
				winner = ib.ID
			}
			type q struct{ envs [][]byte }
			toA, toB := &q{}, &q{}
			gotA, gotB := map[string]int{}, map[string]int{}
			n := 0
			sendA := func(tag string) {
				toB.envs = append(toB.envs, a.send(t, cfg, b, []byte(tag)))
			}
			sendB := func(tag string) {
				toA.envs = append(toA.envs, b.send(t, cfg, a, []byte(tag)))
			}
			// Each side sends during the race; delivery is FIFO per direction
			// (docs/protocol.md, commit boundary, "Ordering") and randomly interleaved across directions.
			for range 3 + rng.IntN(3) {
				sendA(fmt.Sprint("a", n))
				n++
				sendB(fmt.Sprint("b", n))
				n++
			}
			for len(toA.envs)+len(toB.envs) > 0 {
				if len(toB.envs) > 0 && (len(toA.envs) == 0 || rng.IntN(2) == 0) {
					e := toB.envs[0]
					toB.envs = toB.envs[1:]
					gotB[string(b.mustRecv(t, cfg, a, e, nil).Plaintext)]++
				} else {
					e := toA.envs[0]
					toA.envs = toA.envs[1:]
					gotA[string(a.mustRecv(t, cfg, b, e, nil).Plaintext)]++
				}
				// Keep talking during the race sometimes.
				if n < 40 && rng.IntN(3) == 0 {
					if rng.IntN(2) == 0 {
						sendA(fmt.Sprint("a", n))
					} else {
						sendB(fmt.Sprint("b", n))
					}
					n++
				}
			}
			for k, c := range gotB {
				if c != 1 || k[0] != 'a' {
					t.Fatalf("bob got %q %d times", k, c)
				}
			}
			for k, c := range gotA {
				if c != 1 || k[0] != 'b' {
					t.Fatalf("alice got %q %d times", k, c)
				}
			}
			if len(gotA)+len(gotB) != n {
				t.Fatalf("delivered %d of %d", len(gotA)+len(gotB), n)
			}
			ca, _ := a.recs["bob"].Current()
			cb, _ := b.recs["alice"].Current()
			if ca.ID != winner || cb.ID != winner {
				t.Fatalf("current sessions diverge: alice %s bob %s winner %s", ca.ID, cb.ID, winner)
			}
			// After the race both encrypt on the same session id.
			ea, eb := a.send(t, cfg, b, []byte("post a")), b.send(t, cfg, a, []byte("post b"))
			for _, e := range [][]byte{ea, eb} {
				env, _ := messages.DecodeEnvelope(e)
				if env.Header.Session != winner {
					t.Fatal("post-race envelope on another session")
				}
			}
			b.mustRecv(t, cfg, a, ea, []byte("post a"))
			a.mustRecv(t, cfg, b, eb, []byte("post b"))
		})
	}
}
