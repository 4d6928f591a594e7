package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// attacks are run in this order, each for -phase, over and over.
var attacks = []string{
	"bounds-above-clock",  // range requests naming a new bound above the clock each time
	"refetch-known-keys",  // fetching the same known keys again and again
	"random-fingerprints", // range requests and answers with fingerprints that never agree
	"garbage-keys",        // as a responder: keys of garbage events, served when fetched
	"wrong-key",           // as a responder: events the node holds, under another site and HLC
	"non-canonical-keys",  // pushes of key 1 in non-shortest integer heads and floats
	"lease-abuse",         // probes re-taking honest origins' catch-up leases, never delivering
	"notice-flood",        // pushes of events nobody trusts: one notice each at the receiver
}

// hostile is the attacking process: a node with a valid certificate and
// a trusted key (its own; and a second one it signs hand-made events
// with), whose peers accept it.
type hostile struct {
	e       *nodeEnv
	victims []string
	sites   []messages.SiteID // the honest nodes' sites
	trusted *sign.Signer      // a second trusted key
	garbage [][]byte          // events signed by a key nobody trusts
	gkeys   []messages.ReconcileKey
	rng     *mrand.Rand
	mode    atomic.Pointer[string]
	mu      sync.Mutex
	counts  map[string]map[string]int // attack -> outcome -> count
	seq     map[string]uint64         // per victim: the hand-made log's sequence
	log     []byte                    // the hand-made pushes' log id
}

func (h *hostile) count(attack, what string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counts[attack] == nil {
		h.counts[attack] = map[string]int{}
	}
	h.counts[attack][what] += n
}

func (h *hostile) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for _, a := range attacks {
		c := h.counts[a]
		if c == nil {
			continue
		}
		var kv []string
		for k, v := range c {
			kv = append(kv, fmt.Sprintf("%s=%d", k, v))
		}
		slices.Sort(kv)
		parts = append(parts, a+": "+strings.Join(kv, " "))
	}
	return strings.Join(parts, "; ")
}

func runHostile(o options) error {
	e, err := openNode(o)
	if err != nil {
		return err
	}
	defer e.n.Close()
	h := &hostile{e: e, rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 7)), counts: map[string]map[string]int{}, seq: map[string]uint64{}}
	h.log = make([]byte, 16)
	_, _ = rand.Read(h.log)
	for _, m := range e.mf.Members {
		if m.Name != o.name {
			h.victims = append(h.victims, m.Name)
			var s messages.SiteID
			copy(s[:], m.Site)
			h.sites = append(h.sites, s)
		}
	}
	kb, err := os.ReadFile(filepath.Join(o.dir, o.name+".signkey"))
	if err != nil {
		return err
	}
	var site messages.SiteID
	copy(site[:], kb)
	h.trusted = sign.NewSigner(site, ed25519.PrivateKey(kb[len(site):]))
	if err := h.makeGarbage(2048); err != nil {
		return err
	}
	idle := ""
	h.mode.Store(&idle)
	e.n.Remote().Serve(runtime.InterceptServedReconcile(e.n, h.serve))

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var wg sync.WaitGroup
	if o.attack {
		wg.Add(1)
		go func() { defer wg.Done(); h.run(ctx) }()
	}
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	enc := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	stopAttacks := func() {
		cancel()
		wg.Wait()
		h.mode.Store(&idle)
	}
	for {
		select {
		case c, ok := <-cmds:
			if !ok {
				stopAttacks()
				return nil
			}
			if strings.TrimSpace(c) == "final" {
				stopAttacks()
				st := status{Kind: "final", Node: o.name, AttackLog: h.summary()}
				st.Events, _ = e.n.LastSeq(e.ctx)
				if err := enc.Encode(st); err != nil {
					return err
				}
			}
		case <-tick.C:
			st := status{Kind: "status", Node: o.name, Attack: *h.mode.Load(), RSS: rss()}
			st.Events, _ = e.n.LastSeq(e.ctx)
			if err := enc.Encode(st); err != nil {
				return err
			}
		}
	}
}

// makeGarbage signs n events with a key nobody trusts.
func (h *hostile) makeGarbage(n int) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	var site messages.SiteID
	_, _ = rand.Read(site[:])
	s := sign.NewSigner(site, priv)
	base := uint64(time.Now().Add(-time.Hour).UnixMilli())
	for i := 0; i < n; i++ {
		hlc, err := messages.NewHLC(base+uint64(i), 0)
		if err != nil {
			return err
		}
		raw, err := s.Sign(&messages.Event{Site: site, HLC: hlc, Schema: "app", Table: "items",
			Key: messages.Columns{"id": messages.MustValue(1_000_000 + i)}, Payload: messages.Columns{"owner": messages.MustValue("garbage")}}, meshID)
		if err != nil {
			return err
		}
		h.garbage = append(h.garbage, raw)
		h.gkeys = append(h.gkeys, messages.NewReconcileKey(site, hlc, eventid.Of(raw)))
	}
	slices.SortFunc(h.gkeys, func(a, b messages.ReconcileKey) int { return bytes.Compare(a[:], b[:]) })
	return nil
}

// run cycles through the attacks until ctx ends.
func (h *hostile) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		a := attacks[i%len(attacks)]
		h.mode.Store(&a)
		actx, cancel := context.WithTimeout(ctx, h.e.o.phase)
		h.attack(actx, a)
		<-actx.Done()
		cancel()
	}
}

// attack runs one attack against every victim in turn until ctx ends.
// The responder attacks only switch what serve answers: the victims'
// own reconciliations (every -reconcile) come to it.
func (h *hostile) attack(ctx context.Context, a string) {
	switch a {
	case "garbage-keys", "wrong-key":
		return
	}
	for i := 0; ctx.Err() == nil; i++ {
		v := h.victims[i%len(h.victims)]
		var err error
		switch a {
		case "bounds-above-clock":
			err = h.rangeRequest(ctx, a, v, true)
		case "random-fingerprints":
			err = h.rangeRequest(ctx, a, v, false)
		case "refetch-known-keys":
			err = h.refetch(ctx, v)
		case "non-canonical-keys":
			err = h.nonCanonical(ctx, v)
		case "lease-abuse":
			err = h.leaseAbuse(ctx, v)
		case "notice-flood":
			err = h.flood(ctx, v)
		}
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, runtime.ErrReconcileLimited), errors.Is(err, runtime.ErrReconcileBusy), errors.Is(err, runtime.ErrReconcileRefused):
			h.count(a, "refused", 1)
			pause(ctx, 20*time.Millisecond)
		case err != nil:
			h.count(a, "error", 1)
			pause(ctx, 50*time.Millisecond)
		default:
			h.count(a, "served", 1)
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (h *hostile) randFP() (fp [messages.FingerprintSize]byte) {
	for i := range fp {
		fp[i] = byte(h.rng.Uint32())
	}
	return fp
}

// rangeRequest sends one range request with a random fingerprint: above
// the clock, a new bound each time an hour and more ahead; else a new
// bound each time within the last hour.
func (h *hostile) rangeRequest(ctx context.Context, a, victim string, above bool) error {
	call, err := runtime.ReconcileRequester(h.e.n.Remote(), h.e.o.name, victim)
	if err != nil {
		return err
	}
	now := uint64(time.Now().UnixMilli())
	phys := now - uint64(h.rng.IntN(3600_000))
	if above {
		phys = now + 3600_000 + uint64(h.rng.IntN(3600_000))
	}
	bound, err := messages.NewHLC(phys, uint16(h.rng.Uint32()))
	if err != nil {
		return err
	}
	body, err := messages.EncodeReconcile(&messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "app", Table: "items", Bound: bound,
		Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: h.randFP()}}}}})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = call(rctx, runtime.ReconcileRangeRequest, body)
	return err
}

// knownKeys are the keys of up to 4096 events this node holds.
func (h *hostile) knownKeys(ctx context.Context) ([]messages.ReconcileKey, map[messages.EventID][]byte, error) {
	var keys []messages.ReconcileKey
	raws := map[messages.EventID][]byte{}
	for le, err := range h.e.n.LogEntries(ctx, 0) {
		if err != nil {
			return nil, nil, err
		}
		if len(keys) >= 4096 {
			break
		}
		if le.Schema == "app" && le.Table == "items" {
			keys = append(keys, messages.NewReconcileKey(le.Site, le.HLC, le.ID))
			raws[le.ID] = le.Raw
		}
	}
	slices.SortFunc(keys, func(a, b messages.ReconcileKey) int { return bytes.Compare(a[:], b[:]) })
	return slices.Compact(keys), raws, nil
}

func (h *hostile) refetch(ctx context.Context, victim string) error {
	keys, _, err := h.knownKeys(ctx)
	if err != nil || len(keys) == 0 {
		pause(ctx, 100*time.Millisecond)
		return err
	}
	body, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: "app", Table: "items", Keys: keys}}})
	if err != nil {
		return err
	}
	call, err := runtime.ReconcileRequester(h.e.n.Remote(), h.e.o.name, victim)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := call(rctx, runtime.ReconcileFetchRequest, body)
	h.count("refetch-known-keys", "bytes-in", len(out))
	h.count("refetch-known-keys", "bytes-out", len(body))
	return err
}

// push sends a hand-made push on this process's second log (a log id of
// its own, so its cursor at the victim is apart from its node's).
func (h *hostile) push(ctx context.Context, victim string, events [][]byte, offer []messages.OfferRange) (*messages.PushResult, error) {
	h.mu.Lock()
	after := h.seq[victim]
	p := &messages.SyncPush{V: messages.SyncVersion, From: h.e.o.name, To: victim, Log: h.log, After: after, Through: after, Tail: after, Offer: offer}
	for _, raw := range events {
		p.Through++
		p.Events = append(p.Events, messages.PushedEvent{Seq: p.Through, Raw: raw})
	}
	p.Tail = p.Through
	h.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := h.e.n.Remote().Push(pctx, victim, p)
	if err == nil {
		h.mu.Lock()
		h.seq[victim] = max(h.seq[victim], p.Through)
		h.mu.Unlock()
	}
	return res, err
}

// nonCanonical pushes events keyed by id 1 in each non-canonical
// encoding (and one canonical), signed with the trusted second key.
func (h *hostile) nonCanonical(ctx context.Context, victim string) error {
	encodings := [][]byte{
		{0x01},
		{0x18, 0x01},
		{0x19, 0x00, 0x01},
		{0x1a, 0x00, 0x00, 0x00, 0x01},
		{0x1b, 0, 0, 0, 0, 0, 0, 0, 0x01},
		{0xf9, 0x3c, 0x00},
		{0xfa, 0x3f, 0x80, 0x00, 0x00},
		{0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0},
	}
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		return err
	}
	site := h.trusted.Site()
	var raws [][]byte
	for i, enc := range encodings {
		hlc, err := messages.NewHLC(uint64(time.Now().UnixMilli()), uint16(i+1))
		if err != nil {
			return err
		}
		b, err := em.Marshal(map[string]any{
			"v": 1, "hlc": uint64(hlc), "site": site[:], "schema": "app", "table": "items",
			"key":     cbor.RawMessage(append([]byte{0xa1, 0x62, 'i', 'd'}, enc...)),
			"payload": map[string]any{"owner": "hostile-signer", "n": i},
		})
		if err != nil {
			return err
		}
		raw, err := h.trusted.SignPayload(b, meshID)
		if err != nil {
			return err
		}
		raws = append(raws, raw)
	}
	res, err := h.push(ctx, victim, raws, nil)
	if err == nil {
		h.count("non-canonical-keys", "events-pushed", len(raws))
		h.count("non-canonical-keys", "settled-at-receiver", int(res.Applied))
		pause(ctx, 50*time.Millisecond)
	}
	return err
}

// leaseAbuse probes for every honest origin's events (a catch-up lease
// per site), then releases the leases delivering nothing, over and over.
func (h *hostile) leaseAbuse(ctx context.Context, victim string) error {
	top, err := messages.NewHLC(uint64(time.Now().UnixMilli()), 0)
	if err != nil {
		return err
	}
	var offer []messages.OfferRange
	for _, s := range h.sites {
		d := make([]byte, messages.OfferDigestSize)
		_, _ = rand.Read(d)
		offer = append(offer, messages.OfferRange{Site: s, From: 1, To: top, Count: 1000, Digest: d})
	}
	res, err := h.push(ctx, victim, nil, offer)
	if err != nil {
		return err
	}
	for _, v := range res.Verdicts {
		h.count("lease-abuse", fmt.Sprintf("verdict-%d", v), 1)
	}
	// At its tail, delivering nothing: the leases are released.
	_, err = h.push(ctx, victim, nil, nil)
	pause(ctx, 20*time.Millisecond)
	return err
}

// flood pushes a batch of events signed by a key nobody trusts: each is
// dropped and notified at the receiver.
func (h *hostile) flood(ctx context.Context, victim string) error {
	res, err := h.push(ctx, victim, h.garbage[:1000], nil)
	if err == nil {
		h.count("notice-flood", "events-pushed", 1000)
		h.count("notice-flood", "settled-at-receiver", int(res.Applied))
	}
	return err
}

// serve answers the victims' reconciliations with this node: honestly,
// or as the responder attack of the moment.
func (h *hostile) serve(ctx context.Context, from string, kind byte, body []byte, next runtime.ServeReconcile) ([]byte, error) {
	a := *h.mode.Load()
	switch a {
	case "garbage-keys", "wrong-key", "random-fingerprints":
	default:
		return next(ctx, from, kind, body)
	}
	switch kind {
	case runtime.ReconcileRangeRequest:
		in, err := messages.DecodeReconcile(body)
		if err != nil {
			return nil, err
		}
		out := &messages.Reconcile{}
		for _, g := range in.Groups {
			if g.Schema != "app" || g.Table != "items" {
				continue
			}
			var r messages.ReconcileRange
			switch a {
			case "random-fingerprints":
				r = messages.ReconcileRange{Mode: messages.RangeFingerprint, FP: h.randFP()}
			case "garbage-keys":
				if len(g.Ranges) == 0 || g.Ranges[0].Mode != messages.RangeSum {
					continue
				}
				r = messages.ReconcileRange{Mode: messages.RangeIDList, Keys: h.gkeys}
			case "wrong-key":
				if len(g.Ranges) == 0 || g.Ranges[0].Mode != messages.RangeSum {
					continue
				}
				keys, _, err := h.knownKeys(ctx)
				if err != nil {
					return nil, err
				}
				var wrong []messages.ReconcileKey
				for _, k := range keys {
					s := k.Site()
					s[15] ^= 0xff
					wrong = append(wrong, messages.NewReconcileKey(s, k.HLC()+1, k.ID()))
				}
				slices.SortFunc(wrong, func(a, b messages.ReconcileKey) int { return bytes.Compare(a[:], b[:]) })
				r = messages.ReconcileRange{Mode: messages.RangeIDList, Keys: wrong}
			}
			h.count(a, "rounds", 1)
			out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: g.Bound, Ranges: []messages.ReconcileRange{r}})
		}
		return messages.EncodeReconcile(out)
	case runtime.ReconcileFetchRequest:
		in, err := messages.DecodeReconcileFetch(body)
		if err != nil {
			return nil, err
		}
		byID := map[messages.EventID][]byte{}
		if a == "garbage-keys" {
			for _, raw := range h.garbage {
				byID[eventid.Of(raw)] = raw
			}
		} else {
			_, raws, err := h.knownKeys(ctx)
			if err != nil {
				return nil, err
			}
			byID = raws
		}
		out := &messages.ReconcileEvents{}
		size := 0
		for _, g := range in.Groups {
			for _, k := range g.Keys {
				if raw, ok := byID[k.ID()]; ok && size+len(raw) < messages.MaxReconcileEventBytes {
					out.Events = append(out.Events, raw)
					size += len(raw)
				}
			}
		}
		h.count(a, "events-served", len(out.Events))
		return messages.EncodeReconcileEvents(out)
	}
	return next(ctx, from, kind, body)
}
