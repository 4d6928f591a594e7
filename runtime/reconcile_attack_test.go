package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// hostileTransport is a peer that answers reconciliation requests with
// whatever its functions return (a holder of a valid certificate and a
// trusted key: it is attributed correctly, and its answers decode).
type hostileTransport struct {
	Transport
	rangeFn func(in *messages.Reconcile) *messages.Reconcile
	fetchFn func(in *messages.ReconcileFetch) *messages.ReconcileEvents
}

func (h *hostileTransport) reconcileCall(_ context.Context, _, _ string, kind byte, req []byte) ([]byte, error) {
	switch kind {
	case reconcileKindRange:
		in, err := messages.DecodeReconcile(req)
		if err != nil {
			return nil, err
		}
		return messages.EncodeReconcile(h.rangeFn(in))
	case reconcileKindFetch:
		in, err := messages.DecodeReconcileFetch(req)
		if err != nil {
			return nil, err
		}
		return messages.EncodeReconcileEvents(h.fetchFn(in))
	}
	return nil, fmt.Errorf("kind %d", kind)
}

// storedEvents lists the node's retained events.
func storedEvents(t *testing.T, n *testNode) []persistence.StoredEvent {
	t.Helper()
	var out []persistence.StoredEvent
	if err := n.store.View(n.ctx, func(tx persistence.SyncReader) error {
		return tx.EventsAfter(0, 0, func(ev persistence.StoredEvent) (bool, error) {
			out = append(out, ev)
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func serveByID(raws map[messages.EventID][]byte) func(in *messages.ReconcileFetch) *messages.ReconcileEvents {
	return func(in *messages.ReconcileFetch) *messages.ReconcileEvents {
		out := &messages.ReconcileEvents{}
		for _, g := range in.Groups {
			for _, k := range g.Keys {
				if raw, ok := raws[k.ID()]; ok {
					out.Events = append(out.Events, raw)
				}
			}
		}
		return out
	}
}

// TestAttackFetchedEventUnderWrongKey: a responder listed events the node
// already holds under another site and HLC; the node fetched them by id
// and verified and applied them again every session ("missing 50 000"
// each time). A fetched event must be the one its key names.
func TestAttackFetchedEventUnderWrongKey(t *testing.T) {
	a := wrongKeyPeer(t)
	for session := 1; session <= 2; session++ {
		rep, err := a.Reconcile(a.ctx, "m")
		if !errors.Is(err, ErrReconcilePeer) || rep.Fetched != 0 {
			t.Fatalf("session %d: %d events the node holds, offered under another site and HLC, fetched and verified again (err %v); want ErrReconcilePeer and none applied", session, rep.Fetched, err)
		}
	}
}

// wrongKeyPeer returns a node with a peer "m" that lists the node's own
// events under another site and HLC, and serves them when fetched.
func wrongKeyPeer(t *testing.T) *testNode {
	a, _, net := reconPair(t, true)
	for i := 0; i < 5; i++ {
		a.write(i)
	}
	raws := map[messages.EventID][]byte{}
	var wrong []messages.ReconcileKey
	for _, ev := range storedEvents(t, a) {
		raws[ev.ID] = ev.Raw
		site := ev.Site
		site[15] ^= 0xff
		wrong = append(wrong, messages.NewReconcileKey(site, ev.HLC+1, ev.ID))
	}
	wrong = sortedReconKeys(wrong)
	h := &hostileTransport{Transport: net.Transport("a"), fetchFn: serveByID(raws)}
	h.rangeFn = func(in *messages.Reconcile) *messages.Reconcile {
		out := &messages.Reconcile{SumRanges: in.SumRanges}
		for _, g := range in.Groups {
			if g.Ranges[0].Mode != messages.RangeSum {
				continue // the id list below settles it
			}
			out.Groups = append(out.Groups, messages.ReconcileGroup{Schema: g.Schema, Table: g.Table, Bound: g.Bound,
				Ranges: []messages.ReconcileRange{{Mode: messages.RangeIDList, Keys: wrong}}})
		}
		return out
	}
	if err := a.AddPeer("m", h, ""); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestFetchMismatchIsTypedAndCounted: the mismatch is
// ErrReconcileFetchMismatch, counted against that peer.
func TestFetchMismatchIsTypedAndCounted(t *testing.T) {
	a := wrongKeyPeer(t)
	for i := 0; i < 2; i++ {
		if _, err := a.Reconcile(a.ctx, "m"); !errors.Is(err, ErrReconcileFetchMismatch) {
			t.Fatalf("%v, want ErrReconcileFetchMismatch", err)
		}
	}
	if got := testutil.ToFloat64(a.recon.metrics.faults.WithLabelValues("m", "fetch_mismatch")); got != 2 {
		t.Fatalf("fetch_mismatch faults of m: %v, want 2", got)
	}
}

func sortedReconKeys(k []messages.ReconcileKey) []messages.ReconcileKey {
	for i := 1; i < len(k); i++ {
		for j := i; j > 0 && string(k[j][:]) < string(k[j-1][:]); j-- {
			k[j], k[j-1] = k[j-1], k[j]
		}
	}
	return k
}

// TestAttackNewBoundEveryRequestIsMetered: one 46-byte request naming a
// new bound each time defeated the responder's cache and made it read its
// table again (~5 µs of CPU per stored event), without limit. Work for a
// peer is metered against a budget set by what the node holds, and a
// request past it is refused; another peer is still served. A bound above
// the node's clock plus the skew bound is refused outright.
func TestAttackNewBoundEveryRequestIsMetered(t *testing.T) {
	a, b, _ := reconPair(t, true)
	for i := 0; i < 100; i++ {
		b.write(i)
	}
	req := func(bound messages.HLC) []byte {
		var fp [messages.FingerprintSize]byte
		fp[0] = byte(bound)
		return mustEncode(t, &messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "app", Table: "t", Bound: bound,
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: fp}}}}})
	}
	future := hlcAt(b.wall.MS()+10*60*1000, 0)
	if _, err := b.handleReconcile(b.ctx, "mallory", reconcileKindRange, req(future)); !errors.Is(err, ErrReconcilePeer) {
		t.Errorf("bound 10 minutes ahead of the node's clock: %v, want ErrReconcilePeer", err)
	}
	const requests = 2000
	refused := 0
	for i := 1; i <= requests; i++ {
		_, err := b.handleReconcile(b.ctx, "mallory", reconcileKindRange, req(messages.HLC(i)))
		if errors.Is(err, ErrReconcileBusy) {
			refused = i
			break
		}
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if refused == 0 {
		t.Fatalf("%d requests, each with a new bound, all served; want a refusal once the peer's work budget is spent", requests)
	}
	t.Logf("refused at request %d", refused)
	// The budget is mallory's alone.
	if rep := a.reconcile("b"); rep.Missing != 100 {
		t.Fatalf("honest peer after the flood: %+v", rep)
	}
}

// TestAttackRefetchingKnownKeysIsMetered: fetching the same known keys
// again and again was served without limit (410× bytes out per byte in
// for ~15 KB events). Bytes served to a peer are metered and a fetch past
// the budget is refused. The meter's clock is the test's: one burst is
// served, then nothing until the clock moves, then the refill rate's
// worth for the time it moved (on a loaded machine a slow loop no longer
// refills the budget as fast as it spends it).
func TestAttackRefetchingKnownKeysIsMetered(t *testing.T) {
	_, b, _ := reconPair(t, true)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	b.recon.mu.Lock()
	b.recon.now = func() time.Time { return time.Unix(0, clock.Load()) }
	b.recon.meters = nil
	b.recon.mu.Unlock()
	big := strings.Repeat("x", 16<<10)
	for i := 0; i < 50; i++ {
		if _, err := b.Upsert(b.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": big}); err != nil {
			t.Fatal(err)
		}
	}
	var keys []messages.ReconcileKey
	event := 0 // bytes of the largest event
	for _, ev := range storedEvents(t, b) {
		keys = append(keys, messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID))
		event = max(event, len(ev.Raw))
	}
	body, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: "app", Table: "t", Keys: sortedReconKeys(keys)}}})
	if err != nil {
		t.Fatal(err)
	}
	// fetch repeats the fetch until it is refused and returns the bytes
	// served meanwhile.
	fetch := func(what string, requests int) (in, out int) {
		t.Helper()
		for i := 0; i < requests; i++ {
			raw, err := b.handleReconcile(b.ctx, "mallory", reconcileKindFetch, body)
			if errors.Is(err, ErrReconcileBusy) {
				return in, out
			}
			if err != nil {
				t.Fatal(err)
			}
			in += len(body)
			out += len(raw)
		}
		t.Fatalf("%s: %d fetches of the same %d known keys all served: %d bytes out for %d in (%.0f×); want a refusal past the peer's byte budget", what, requests, len(keys), out, in, float64(out)/float64(in))
		return in, out
	}
	// framing is what a reply adds to its events' bytes: a few bytes an
	// event.
	framing := func(out int) int { return out / event * 64 }
	in, out := fetch("burst", 400)
	t.Logf("%d bytes out for %d in (%.0f×) before the refusal", out, in, float64(out)/float64(in))
	if out < fetchBytesBurst-event || out > fetchBytesBurst+framing(out) {
		t.Fatalf("served %d bytes before the refusal, want the burst: %d", out, fetchBytesBurst)
	}
	// Refused while the clock stands still; one second later, one
	// second's refill.
	if _, err := b.handleReconcile(b.ctx, "mallory", reconcileKindFetch, body); !errors.Is(err, ErrReconcileLimited) {
		t.Fatalf("fetch at once after the refusal: %v, want ErrReconcileLimited", err)
	}
	clock.Add(int64(time.Second))
	_, out = fetch("refill", 20)
	// (What was left below one event before is still there.)
	if out < fetchBytesPerSec-event || out > fetchBytesPerSec+event+framing(out) {
		t.Fatalf("served %d bytes one second after the refusal, want the refill: %d", out, fetchBytesPerSec)
	}
}

// TestAttackGarbageKeysAreBoundedPerSession: a responder naming keys of
// garbage it then serves (events the chokepoint drops) made every session
// download and drop all of them (~1 GiB and 69 632 notices per session).
// A session stops fetching once it saw as many drops as the node can
// remember, so its download and notices are bounded.
func TestAttackGarbageKeysAreBoundedPerSession(t *testing.T) {
	a, _, net := reconPair(t, true)
	stranger := newPeer(t, 0x7f) // never trusted: its events are dropped
	const batches, per = 3, 4096
	raws := map[messages.EventID][]byte{}
	var batch [batches][]messages.ReconcileKey
	base := uint64(time.Now().Add(-time.Hour).UnixMilli())
	for r := 0; r < batches; r++ {
		for i := 0; i < per; i++ {
			raw := stranger.upsert(hlcAt(base+uint64(r*per+i), 0), r*per+i, map[string]any{"a": 1})
			id := eventid.Of(raw)
			raws[id] = raw
			batch[r] = append(batch[r], messages.NewReconcileKey(stranger.signer.Site(), hlcAt(base+uint64(r*per+i), 0), id))
		}
	}
	round := 0
	h := &hostileTransport{Transport: net.Transport("a"), fetchFn: serveByID(raws)}
	h.rangeFn = func(in *messages.Reconcile) *messages.Reconcile {
		if round == batches || len(in.Groups) == 0 {
			return &messages.Reconcile{}
		}
		keys := batch[round]
		round++
		var upper []byte
		if round < batches {
			next := batch[round][0]
			upper = next[:]
		}
		ranges := []messages.ReconcileRange{{Mode: messages.RangeIDList, Upper: upper, Keys: keys}}
		if upper != nil {
			ranges = append(ranges, messages.ReconcileRange{Mode: messages.RangeFingerprint, FP: [messages.FingerprintSize]byte{1}})
		}
		g := in.Groups[0]
		return &messages.Reconcile{SumRanges: in.SumRanges, Groups: []messages.ReconcileGroup{{Schema: g.Schema, Table: g.Table, Bound: g.Bound, Ranges: ranges}}}
	}
	if err := a.AddPeer("m", h, ""); err != nil {
		t.Fatal(err)
	}
	rep, err := a.Reconcile(a.ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != batches*per {
		t.Fatalf("the responder named %d keys, want %d: %+v", rep.Missing, batches*per, rep)
	}
	if rep.Fetched > per {
		t.Fatalf("one session fetched %d garbage events (%d dropped, %d bytes received); want at most %d", rep.Fetched, rep.Outcomes[messages.Dropped], rep.BytesReceived, per)
	}
}

// TestReconcileRequesterAndIntercept: the hooks benchmarks use to play a
// peer carry requests unchanged when they forward, and a raw request is
// attributed to the transport's node.
func TestReconcileRequesterAndIntercept(t *testing.T) {
	a, b, net := reconPair(t, true)
	for i := 0; i < 3; i++ {
		a.write(i)
	}
	calls := 0
	fwd := InterceptReconcile(net.Transport("b"), func(ctx context.Context, kind byte, body []byte, next ReconcileCall) ([]byte, error) {
		calls++
		return next(ctx, kind, body)
	})
	if err := b.AddPeer("a2", fwd, ""); err != nil {
		t.Fatal(err)
	}
	// "a2" is a's other name on b; the network routes by the callee's name, a.
	net.Register("a2", a.Node)
	rep, err := b.Reconcile(b.ctx, "a2")
	if err != nil || rep.Missing != 3 || rep.Outcomes[messages.Applied] != 3 || calls != rep.Rounds+1 {
		t.Fatalf("through a forwarding interceptor: %+v, %d calls, %v", rep, calls, err)
	}
	var keys []messages.ReconcileKey
	for _, ev := range storedEvents(t, a) {
		keys = append(keys, messages.NewReconcileKey(ev.Site, ev.HLC, ev.ID))
	}
	body, err := messages.EncodeReconcileFetch(&messages.ReconcileFetch{Groups: []messages.FetchGroup{{Schema: "app", Table: "t", Keys: sortedReconKeys(keys)}}})
	if err != nil {
		t.Fatal(err)
	}
	call, err := ReconcileRequester(net.Transport("m"), "m", "a")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := call(a.ctx, ReconcileFetchRequest, body)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := messages.DecodeReconcileEvents(raw)
	if err != nil || len(evs.Events) != 3 {
		t.Fatalf("raw fetch: %v events, %v", evs, err)
	}
}

// TestRequestsReadOnlyNewEvents: a responder reads a group's keys from the
// store once; later requests, whatever bound they name, read only the
// events appended since, and the keys stay those the store lists.
func TestRequestsReadOnlyNewEvents(t *testing.T) {
	_, b, _ := reconPair(t, true)
	for i := 0; i < 200; i++ {
		b.write(i)
	}
	req := func(bound messages.HLC) {
		t.Helper()
		body := mustEncode(t, &messages.Reconcile{Groups: []messages.ReconcileGroup{{Schema: "app", Table: "t", Bound: bound,
			Ranges: []messages.ReconcileRange{{Mode: messages.RangeFingerprint, FP: [messages.FingerprintSize]byte{byte(bound)}}}}}})
		if _, err := b.handleReconcile(b.ctx, "mallory", reconcileKindRange, body); err != nil {
			t.Fatal(err)
		}
	}
	reads := func() uint64 {
		b.recon.index.mu.Lock()
		defer b.recon.index.mu.Unlock()
		return b.recon.index.reads
	}
	req(1)
	if r := reads(); r != 200 {
		t.Fatalf("first request read %d events, want the group's 200", r)
	}
	for i := 2; i < 20; i++ {
		req(messages.HLC(i))
	}
	if r := reads(); r != 200 {
		t.Fatalf("18 more requests with new bounds read %d events more, want 0", r-200)
	}
	for i := 200; i < 205; i++ {
		b.write(i)
	}
	req(30)
	if r := reads(); r != 205 {
		t.Fatalf("after 5 writes a request read %d events, want 5", r-200)
	}
	var want []messages.ReconcileKey
	if err := b.store.View(b.ctx, func(tx persistence.SyncReader) error {
		return tx.TableEventKeys(persistence.TableKey{Schema: "app", Table: "t"}, 0, func(k persistence.EventKey) (bool, error) {
			want = append(want, messages.NewReconcileKey(k.Site, k.HLC, k.ID))
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	b.recon.index.mu.Lock()
	got := b.recon.index.groups[reconcile.Group{Schema: "app", Table: "t"}].idx.View(0).List(nil, nil)
	b.recon.index.mu.Unlock()
	if len(got) != len(want) || string(keyBytes(got)) != string(keyBytes(want)) {
		t.Fatalf("index holds %d keys, the store lists %d (or they differ)", len(got), len(want))
	}
}

func keyBytes(k []messages.ReconcileKey) []byte {
	var b []byte
	for i := range k {
		b = append(b, k[i][:]...)
	}
	return b
}

// TestInterceptServedReconcile: the hook soaks use to play a hostile
// responder over a real transport sees every request of a session with
// the caller's name; forwarded, the session repairs as without it;
// answered by the hook, its answer is what the caller gets.
func TestInterceptServedReconcile(t *testing.T) {
	a, b, net := reconPair(t, true)
	for i := 0; i < 3; i++ {
		a.write(i)
	}
	calls, answer := 0, false
	var from string
	net.Register("a", InterceptServedReconcile(a.Node, func(ctx context.Context, f string, kind byte, body []byte, next ServeReconcile) ([]byte, error) {
		calls++
		from = f
		if answer && kind == ReconcileRangeRequest {
			return messages.EncodeReconcile(&messages.Reconcile{}) // "nothing differs"
		}
		return next(ctx, f, kind, body)
	}))
	rep, err := b.Reconcile(b.ctx, "a")
	if err != nil || rep.Missing != 3 || rep.Outcomes[messages.Applied] != 3 || calls != rep.Rounds+1 || from != "b" {
		t.Fatalf("forwarded: %+v, %d calls from %q, %v", rep, calls, from, err)
	}
	a.write(3)
	answer = true
	rep, err = b.Reconcile(b.ctx, "a")
	if err != nil || rep.Missing != 0 {
		t.Fatalf("answered by the hook: %+v, %v; want nothing missing", rep, err)
	}
	if _, ok := b.get(3); ok {
		t.Fatal("b holds row 3: the node answered, not the hook")
	}
}
