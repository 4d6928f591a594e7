package main

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/syncmesh/syncmesh/actors/session"
	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/examples/benchreport/internal/sessionmem"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/memory"
)

// sessionsReport prints the delivery plane's session costs: round trips
// (one encrypt plus one decrypt of 256 B on an established session)
// through the session actors and through the bare ratchet, each beside
// the same run's floor (one X25519 plus an AES-256-GCM seal and open of
// 256 B), and the resident heap of idle sessions persisted versus live.
func sessionsReport(rounds, idle int) error {
	fmt.Printf("== sessions: %d round trips of 256 B per line (one encrypt + one decrypt, established session); %d idle sessions\n", rounds, idle)
	msg := bytes.Repeat([]byte{0x5a}, 256)
	bare, err := bareRate(rounds, msg)
	if err != nil {
		return err
	}
	var raw, act [2]float64 // [one direction, ping-pong]
	for i, alt := range []bool{false, true} {
		if raw[i], err = ratchetRate(rounds, msg, alt); err != nil {
			return err
		}
		if act[i], err = actorRate(rounds, msg, alt); err != nil {
			return err
		}
	}
	fmt.Printf("floor         bare X25519 + AES-256-GCM seal+open 256 B  %8.0f /s\n", bare)
	for i, mode := range []string{"one direction (symmetric chain step)", "ping-pong (DH ratchet step each message)"} {
		fmt.Printf("%s:\n", mode)
		fmt.Printf("  ratchet     raw Encrypt+Decrypt values               %8.0f rt/s   ratchet/floor = %.2f\n", raw[i], raw[i]/bare)
		fmt.Printf("  actors      Manager Encrypt+Decrypt, memory store    %8.0f rt/s   actors/floor  = %.2f   actors/ratchet = %.2f\n", act[i], act[i]/bare, act[i]/raw[i])
	}

	start := time.Now()
	persisted, live, err := sessionmem.IdleSessions(idle)
	if err != nil {
		return err
	}
	pp, lp := float64(persisted)/float64(idle), float64(live)/float64(idle)
	fmt.Printf("idle memory   persisted %6.0f B/session   live actor +%6.0f B/session (total with its record %6.0f)   actor/persisted = %.2f   (%d sessions, %.1f s)\n",
		pp, lp, pp+lp, lp/pp, idle, time.Since(start).Seconds())
	return nil
}

// bareRate is the floor: one X25519 shared secret, then an AES-256-GCM
// key schedule, seal and open of msg, per operation.
func bareRate(n int, msg []byte) (float64, error) {
	k1, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return 0, err
	}
	k2, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return 0, err
	}
	nonce := make([]byte, 12)
	start := time.Now()
	for range n {
		ss, err := k1.ECDH(k2.PublicKey())
		if err != nil {
			return 0, err
		}
		blk, err := aes.NewCipher(ss)
		if err != nil {
			return 0, err
		}
		g, err := cipher.NewGCM(blk)
		if err != nil {
			return 0, err
		}
		if _, err := g.Open(nil, nonce, g.Seal(nil, nonce, msg, nil), nil); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// ratchetRate runs Encrypt (alice) and Decrypt (bob) on crypto/ratchet
// values directly: no actors, no store.
func ratchetRate(n int, msg []byte, alternate bool) (float64, error) {
	alice, err := ratchet.NewIdentity()
	if err != nil {
		return 0, err
	}
	bob, err := ratchet.NewIdentity()
	if err != nil {
		return 0, err
	}
	now := time.Now()
	ps, err := ratchet.NewPrekeyStore(bob, now, ratchet.DefaultPrekeyConfig())
	if err != nil {
		return 0, err
	}
	ps, bundle, err := ps.IssueBundle(bob.Public())
	if err != nil {
		return 0, err
	}
	ra, _, err := ratchet.Initiate(ratchet.SessionRecord{}, alice, &bundle, aliceToBob)
	if err != nil {
		return 0, err
	}
	var rb ratchet.SessionRecord
	// Establish: one message each way, so the loop measures steady state.
	ra, env, err := ratchet.Encrypt(ra, []byte("hello"))
	if err != nil {
		return 0, err
	}
	res, err := ratchet.Decrypt(rb, bob, ps, env, aliceToBob, now)
	if err != nil {
		return 0, err
	}
	rb, ps = res.Record, res.Prekeys
	rb, env, err = ratchet.Encrypt(rb, []byte("hi"))
	if err != nil {
		return 0, err
	}
	if res, err = ratchet.Decrypt(ra, alice, ratchet.PrekeyStore{}, env, bobToAlice, now); err != nil {
		return 0, err
	}
	ra = res.Record
	start := time.Now()
	for i := range n {
		if alternate && i%2 == 1 {
			if rb, env, err = ratchet.Encrypt(rb, msg); err != nil {
				return 0, err
			}
			if res, err = ratchet.Decrypt(ra, alice, ratchet.PrekeyStore{}, env, bobToAlice, now); err != nil {
				return 0, err
			}
			ra = res.Record
			continue
		}
		if ra, env, err = ratchet.Encrypt(ra, msg); err != nil {
			return 0, err
		}
		if res, err = ratchet.Decrypt(rb, bob, ps, env, aliceToBob, now); err != nil {
			return 0, err
		}
		rb = res.Record
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// actorRate runs Encrypt on alice's session Manager and Decrypt on bob's
// (session.NewInProcess transport, memory delivery stores): each call goes
// through the peer's session actor and persists the advanced record.
func actorRate(n int, msg []byte, alternate bool) (float64, error) {
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer sys.Shutdown()
	net := session.NewInProcess()
	aliceAddr := messages.DeviceAddress{User: "alice", Device: 1}
	bobAddr := messages.DeviceAddress{User: "bob", Device: 1}
	start := func(addr messages.DeviceAddress) (*session.Manager, error) {
		m, err := session.NewManager(ctx, sys, session.Config{Store: memory.NewDelivery(), Transport: net.Endpoint(addr), RefreshInterval: -1})
		if err != nil {
			return nil, err
		}
		net.Register(addr, m)
		return m, nil
	}
	a, err := start(aliceAddr)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	b, err := start(bobAddr)
	if err != nil {
		return 0, err
	}
	defer b.Close()
	roundTrip := func(from, to *session.Manager, fromAddr, toAddr messages.DeviceAddress, pt []byte) error {
		env, err := from.Encrypt(ctx, toAddr, pt)
		if err != nil {
			return err
		}
		got, err := to.Decrypt(ctx, fromAddr, env)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, pt) {
			return fmt.Errorf("session round trip: plaintext differs")
		}
		return nil
	}
	// Establish: one message each way.
	if err := roundTrip(a, b, aliceAddr, bobAddr, []byte("hello")); err != nil {
		return 0, err
	}
	if err := roundTrip(b, a, bobAddr, aliceAddr, []byte("hi")); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for i := range n {
		from, to, fromAddr, toAddr := a, b, aliceAddr, bobAddr
		if alternate && i%2 == 1 {
			from, to, fromAddr, toAddr = b, a, bobAddr, aliceAddr
		}
		if err := roundTrip(from, to, fromAddr, toAddr, msg); err != nil {
			return 0, err
		}
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

// The routes of the measured pair's envelopes.
var (
	aliceToBob = ratchet.Route{From: messages.DeviceAddress{User: "alice", Device: 1}, To: messages.DeviceAddress{User: "bob", Device: 1}}
	bobToAlice = ratchet.Route{From: aliceToBob.To, To: aliceToBob.From}
)
