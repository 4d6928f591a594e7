// Package scenario is the member-loss scenario of runtime/hosting (issue
// 6, scale-out): devices and sync groups hosted across the members of a
// Placement, events applied, messages exchanged and committed, one member
// stopped, and every acknowledged effect checked on the survivors. It is
// written against hosting.Placement only, so it runs on the protoactor
// cluster (internal/clusterdemo) and on any other implementation.
package scenario

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
)

// Env is what the scenario runs on: the members of one placement (each
// can route a request to any unit) and how to stop one.
type Env struct {
	Members []hosting.Placement
	// Stop stops member i (its units' state stays in the shared root).
	Stop func(i int) error
	// MeshID is the mesh of the hosted nodes.
	MeshID []byte
	// Logf reports progress; nil: quiet.
	Logf func(format string, args ...any)
}

// Report is what the scenario measured.
type Report struct {
	Devices, Groups        int
	UnitsPerMember         map[string]int
	Victim                 string
	VictimDevices          []string
	VictimGroups           []string
	EventsAcked            int
	Committed, Pending     int
	StopTook, TakeoverTook time.Duration
	MovedTo                map[string]string // unit → survivor now hosting it
	// LoadEvents and LoadMessages count the events applied and messages
	// committed on the victim's units while it was being stopped.
	LoadEvents, LoadMessages int
}

// Table is the table every group holds.
var Table = runtime.TableDef{Schema: "app", Table: "notes", KeyColumns: []string{"id"}, Columns: []string{"text"}}

type msgRef struct {
	from, to messages.DeviceAddress
	id       messages.LogicalMessageID
	body     []byte
}

const (
	eventsPerGroup = 12
	maxUnits       = 48
	// loadOps bounds the operations each unit's load runs during the stop
	// (paced by loadPause, it outlasts a stop of a few seconds).
	loadOps   = 2000
	loadPause = 5 * time.Millisecond
	// afterStop is how many operations each load still runs after the
	// stop returned (on the unit's new host).
	afterStop = 3
)

// Run runs the scenario and returns an error describing the first
// violated guarantee.
func Run(ctx context.Context, env Env) (Report, error) {
	logf := env.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	rep := Report{UnitsPerMember: map[string]int{}, MovedTo: map[string]string{}}
	if len(env.Members) < 2 {
		return rep, errors.New("scenario: needs at least 2 members")
	}
	cl := hosting.Client{P: env.Members[0]}

	// 1. Host devices and groups until every member hosts at least one
	// unit and some member hosts both a device and a group (placement is
	// by hash of the identity, so we grow the set rather than assume).
	var devices []messages.DeviceAddress
	var groups []string
	where := map[string]string{} // "kind/identity" → member
	perMember := func() map[string][2]int {
		m := map[string][2]int{}
		for _, p := range env.Members {
			m[p.Member()] = [2]int{}
		}
		for k, mem := range where {
			c := m[mem]
			if k[:len(hosting.KindDevice)] == hosting.KindDevice {
				c[0]++
			} else {
				c[1]++
			}
			m[mem] = c
		}
		return m
	}
	spread := func() (victim int, ok bool) {
		pm := perMember()
		best := -1
		for i, p := range env.Members {
			c := pm[p.Member()]
			if c[0]+c[1] == 0 {
				return 0, false
			}
			// Member 0 routes the scenario's requests: the victim is
			// another one.
			if i > 0 && c[0] >= 2 && c[1] >= 1 && (best < 0 || c[0]+c[1] > sum(pm[env.Members[best].Member()])) {
				best = i
			}
		}
		return best, best > 0
	}
	victim := 0
	for i := 0; ; i++ {
		if len(devices) >= 6 && len(groups) >= 3 {
			if v, ok := spread(); ok {
				victim = v
				break
			}
		}
		if len(devices)+len(groups) >= maxUnits {
			return rep, fmt.Errorf("scenario: %d units not spread over the members: %v", maxUnits, perMember())
		}
		d := messages.DeviceAddress{User: fmt.Sprintf("user%02d", len(devices)), Device: 1}
		mem, err := cl.Info(ctx, hosting.KindDevice, hosting.DeviceIdentity(d))
		if err != nil {
			return rep, fmt.Errorf("activate device %s: %w", d, err)
		}
		devices = append(devices, d)
		where[hosting.KindDevice+"/"+hosting.DeviceIdentity(d)] = mem
		if i%2 == 0 {
			g := fmt.Sprintf("tenant%02d", len(groups))
			mem, err := cl.Info(ctx, hosting.KindGroup, g)
			if err != nil {
				return rep, fmt.Errorf("activate group %s: %w", g, err)
			}
			groups = append(groups, g)
			where[hosting.KindGroup+"/"+g] = mem
		}
	}
	rep.Devices, rep.Groups = len(devices), len(groups)
	rep.Victim = env.Members[victim].Member()
	for k, mem := range where {
		rep.UnitsPerMember[mem]++
		if mem == rep.Victim {
			if k[:len(hosting.KindDevice)] == hosting.KindDevice {
				rep.VictimDevices = append(rep.VictimDevices, k)
			} else {
				rep.VictimGroups = append(rep.VictimGroups, k)
			}
		}
	}
	sort.Strings(rep.VictimDevices)
	sort.Strings(rep.VictimGroups)
	// Each member's own list agrees with what the grains reported.
	for _, p := range env.Members {
		for _, u := range p.Hosted() {
			if mem, ok := where[u.Kind+"/"+u.Identity]; ok && mem != p.Member() {
				return rep, fmt.Errorf("%s/%s reported member %s but is open on %s", u.Kind, u.Identity, mem, p.Member())
			}
		}
	}
	logf("units per member: %v; victim %s hosts devices %v groups %v", rep.UnitsPerMember, rep.Victim, rep.VictimDevices, rep.VictimGroups)

	// 2. Sync plane: signed events applied on every group, through
	// different members (any member routes to the unit's host).
	w, err := NewWriter(ctx, env.MeshID)
	if err != nil {
		return rep, err
	}
	defer w.Close()
	acked := map[string][]messages.EventID{}
	for gi, g := range groups {
		via := hosting.Client{P: env.Members[gi%len(env.Members)]}
		if err := via.Trust(ctx, g, w.Key()); err != nil {
			return rep, fmt.Errorf("trust on %s: %w", g, err)
		}
		if err := via.DefineTable(ctx, g, Table); err != nil {
			return rep, fmt.Errorf("define on %s: %w", g, err)
		}
		evs, err := w.Events(g, eventsPerGroup)
		if err != nil {
			return rep, err
		}
		for _, batch := range [][][]byte{evs[:eventsPerGroup/2], evs[eventsPerGroup/2:]} {
			outs, _, err := via.Apply(ctx, g, batch)
			if err != nil {
				return rep, fmt.Errorf("apply on %s: %w", g, err)
			}
			for _, o := range outs {
				if o.Kind != messages.Applied {
					return rep, fmt.Errorf("apply on %s: outcome %v", g, o)
				}
				acked[g] = append(acked[g], o.ID)
				rep.EventsAcked++
			}
		}
	}
	digests := map[string][]byte{}
	for _, g := range groups {
		n, h, _, err := cl.Digest(ctx, g)
		if err != nil {
			return rep, err
		}
		if n != uint64(len(acked[g])) {
			return rep, fmt.Errorf("group %s retains %d events, %d acknowledged", g, n, len(acked[g]))
		}
		digests[g] = h
	}
	logf("applied %d events on %d groups", rep.EventsAcked, len(groups))

	// 3. Delivery plane: each device sends two messages to the next one;
	// the first is committed by its recipient, the second stays pending.
	var committed, pending []msgRef
	for i, from := range devices {
		to := devices[(i+1)%len(devices)]
		for j := 0; j < 2; j++ {
			m := msgRef{from: from, to: to, id: idOf(i, j), body: []byte(fmt.Sprintf("%s→%s #%d", from, to, j))}
			if _, err := cl.Send(ctx, from, to, m.id, m.body); err != nil {
				return rep, fmt.Errorf("send %s→%s: %w", from, to, err)
			}
			if j == 0 {
				committed = append(committed, m)
			} else {
				pending = append(pending, m)
			}
		}
	}
	for _, m := range committed {
		res, err := cl.Commit(ctx, m.to, m.from, m.id)
		if err != nil {
			return rep, fmt.Errorf("commit at %s: %w", m.to, err)
		}
		if res.Status != uint8(runtime.Committed) || !res.AckSent {
			return rep, fmt.Errorf("commit at %s: status %d ack %v", m.to, res.Status, res.AckSent)
		}
	}
	rep.Committed, rep.Pending = len(committed), len(pending)
	if err := checkDevices(ctx, cl, devices, committed, pending); err != nil {
		return rep, fmt.Errorf("before the stop: %w", err)
	}
	logf("%d messages committed, %d pending", len(committed), len(pending))

	// 4. Stop the victim while requests for its units are in flight
	// (routed through member 0, a survivor): each is retried until it is
	// acknowledged, so every one must be there after the takeover.
	var recipient messages.DeviceAddress
	for _, d := range devices {
		if where[hosting.KindDevice+"/"+hosting.DeviceIdentity(d)] != rep.Victim {
			recipient = d
			break
		}
	}
	ld := &load{cl: cl, stopped: make(chan struct{})}
	loadEvents := map[string][][]byte{}
	for _, k := range rep.VictimGroups {
		_, g := split(k)
		evs, err := w.Sign(g, loadOps)
		if err != nil {
			return rep, err
		}
		loadEvents[g] = evs
		ld.group(ctx, g, evs)
	}
	for i, k := range rep.VictimDevices {
		_, id := split(k)
		from, err := hosting.ParseDeviceIdentity(id)
		if err != nil {
			return rep, err
		}
		ld.device(ctx, from, recipient, 2000+i)
	}
	time.Sleep(20 * time.Millisecond) // let the load start
	t0 := time.Now()
	if err := env.Stop(victim); err != nil {
		close(ld.stopped)
		ld.wg.Wait()
		return rep, fmt.Errorf("stop member %s: %w", rep.Victim, err)
	}
	rep.StopTook = time.Since(t0)
	close(ld.stopped)
	ld.wg.Wait()
	if ld.err != nil {
		return rep, fmt.Errorf("load during the stop: %w", ld.err)
	}
	for g, ids := range ld.acked {
		acked[g] = append(acked[g], ids...)
		rep.EventsAcked += len(ids)
		w.Record(g, loadEvents[g][:len(ids)])
	}
	committed = append(committed, ld.committed...)
	rep.Committed = len(committed)
	rep.LoadEvents, rep.LoadMessages = ld.events, len(ld.committed)
	logf("stopped %s in %v; meanwhile %d events applied and %d messages committed on its units", rep.Victim, rep.StopTook, ld.events, len(ld.committed))
	// Digests now include the events applied during the stop.
	for _, g := range groups {
		digests[g] = digestOf(acked[g])
	}

	// 5. Survivors take over from the persisted state: every unit answers
	// from a survivor; every acknowledged event and commit is there.
	t1 := time.Now()
	survivor := 0
	if victim == 0 {
		survivor = 1
	}
	cl = hosting.Client{P: env.Members[survivor]}
	for k := range where {
		kind, id := split(k)
		mem, err := cl.Info(ctx, kind, id)
		if err != nil {
			return rep, fmt.Errorf("after the stop, %s: %w", k, err)
		}
		if mem == rep.Victim {
			return rep, fmt.Errorf("after the stop, %s still answers from %s", k, mem)
		}
		if where[k] == rep.Victim {
			rep.MovedTo[k] = mem
		}
	}
	rep.TakeoverTook = time.Since(t1)
	for _, g := range groups {
		n, h, _, err := cl.Digest(ctx, g)
		if err != nil {
			return rep, err
		}
		if n != uint64(len(acked[g])) || !bytes.Equal(h, digests[g]) {
			return rep, fmt.Errorf("after the stop, group %s retains %d events (digest %x), before %d (%x)", g, n, h, len(acked[g]), digests[g])
		}
		ids, err := cl.EventIDs(ctx, g)
		if err != nil {
			return rep, err
		}
		for _, id := range acked[g] {
			if !slices.Contains(ids, id) {
				return rep, fmt.Errorf("after the stop, group %s lost event %s", g, id)
			}
		}
		// Re-applying is a no-op (idempotent by event id), and the rows
		// read back.
		evs, err := w.Events(g, 0)
		if err != nil {
			return rep, err
		}
		outs, _, err := cl.Apply(ctx, g, evs)
		if err != nil {
			return rep, err
		}
		for _, o := range outs {
			if o.Kind != messages.Duplicate {
				return rep, fmt.Errorf("after the stop, re-applying on %s: %v", g, o)
			}
		}
		row, found, err := cl.Get(ctx, g, Table.Schema, Table.Table, map[string]any{"id": int64(eventsPerGroup - 1)})
		if err != nil || !found {
			return rep, fmt.Errorf("after the stop, row of %s: found=%v %v", g, found, err)
		}
		var text string
		if err := row.Cells["text"].Decode(&text); err != nil || text != noteText(g, eventsPerGroup-1) {
			return rep, fmt.Errorf("after the stop, row of %s: %q %v", g, text, err)
		}
	}
	if err := checkDevices(ctx, cl, devices, committed, pending); err != nil {
		return rep, fmt.Errorf("after the stop: %w", err)
	}
	// Repeats across the takeover stay idempotent.
	for _, m := range committed {
		res, err := cl.Commit(ctx, m.to, m.from, m.id)
		if err != nil || res.Status != uint8(runtime.AlreadyCommitted) {
			return rep, fmt.Errorf("after the stop, commit again at %s: %+v %v", m.to, res, err)
		}
	}
	// The taken-over units keep working: new events, new messages.
	for _, k := range append(append([]string(nil), rep.VictimGroups...), rep.VictimDevices...) {
		kind, id := split(k)
		if kind == hosting.KindGroup {
			evs, err := w.Events(id, 1)
			if err != nil {
				return rep, err
			}
			outs, _, err := cl.Apply(ctx, id, evs[len(evs)-1:])
			if err != nil || outs[0].Kind != messages.Applied {
				return rep, fmt.Errorf("after the stop, new event on %s: %v %v", id, outs, err)
			}
			continue
		}
		from, _ := hosting.ParseDeviceIdentity(id)
		to := devices[0]
		if to == from {
			to = devices[1]
		}
		mid := idOf(1000, int(from.User[len(from.User)-1]))
		if _, err := cl.Send(ctx, from, to, mid, []byte("after the takeover")); err != nil {
			return rep, fmt.Errorf("after the stop, send from %s: %w", from, err)
		}
		res, err := cl.Commit(ctx, to, from, mid)
		if err != nil || res.Status != uint8(runtime.Committed) {
			return rep, fmt.Errorf("after the stop, commit at %s: %+v %v", to, res, err)
		}
	}
	logf("survivors took over %d units in %v; all checks passed", len(rep.MovedTo), rep.TakeoverTook)
	return rep, nil
}

// load runs requests on the victim's units while it stops: each request
// is retried (the same request: idempotent) until it succeeds; a unit's
// load runs until afterStop requests succeeded after the stop.
type load struct {
	cl      hosting.Client
	stopped chan struct{}
	wg      sync.WaitGroup

	mu        sync.Mutex
	err       error
	acked     map[string][]messages.EventID
	events    int
	committed []msgRef
}

func (l *load) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
}

// retry runs op until it succeeds or ctx ends; it returns the first
// error and the last one.
func retry(ctx context.Context, op func() error) error {
	var first error
	for {
		err := op()
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (first error: %v)", err, first)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run calls step(i) for i = 0, 1, ... until afterStop steps completed
// after the stop or n steps in all.
func (l *load) run(n int, step func(i int) error) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		after := 0
		for i := 0; after < afterStop; i++ {
			if i == n {
				l.fail(fmt.Errorf("load ran out of its %d operations before the stop ended", n))
				return
			}
			select {
			case <-l.stopped:
				after++
			default:
			}
			if err := step(i); err != nil {
				l.fail(err)
				return
			}
			time.Sleep(loadPause)
		}
	}()
}

func (l *load) group(ctx context.Context, g string, evs [][]byte) {
	l.run(len(evs), func(i int) error {
		var outs []messages.Outcome
		err := retry(ctx, func() (err error) {
			outs, _, err = l.cl.Apply(ctx, g, evs[i:i+1])
			return err
		})
		if err != nil {
			return fmt.Errorf("apply on %s: %w", g, err)
		}
		// Applied, or Duplicate when a lost reply's request was retried.
		if k := outs[0].Kind; k != messages.Applied && k != messages.Duplicate {
			return fmt.Errorf("apply on %s: %v", g, outs[0])
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.acked == nil {
			l.acked = map[string][]messages.EventID{}
		}
		l.acked[g] = append(l.acked[g], outs[0].ID)
		l.events++
		return nil
	})
}

func (l *load) device(ctx context.Context, from, to messages.DeviceAddress, tag int) {
	l.run(loadOps, func(i int) error {
		m := msgRef{from: from, to: to, id: idOf(tag, i), body: []byte(fmt.Sprintf("load %s #%d", from, i))}
		if err := retry(ctx, func() error {
			_, err := l.cl.Send(ctx, m.from, m.to, m.id, m.body)
			return err
		}); err != nil {
			return fmt.Errorf("send %s→%s: %w", m.from, m.to, err)
		}
		var res hosting.Message
		if err := retry(ctx, func() (err error) {
			res, err = l.cl.Commit(ctx, m.to, m.from, m.id)
			if err == nil && !res.AckSent {
				// The ACK did not reach the sender's host (it was
				// moving); committing again re-sends it.
				err = errors.New("ack not sent")
			}
			return err
		}); err != nil {
			return fmt.Errorf("commit %s→%s: %w", m.from, m.to, err)
		}
		if res.Status != uint8(runtime.Committed) && res.Status != uint8(runtime.AlreadyCommitted) {
			return fmt.Errorf("commit %s→%s: status %d", m.from, m.to, res.Status)
		}
		l.mu.Lock()
		l.committed = append(l.committed, m)
		l.mu.Unlock()
		return nil
	})
}

// digestOf is what OpDigest computes: SHA-256 over the sorted ids.
func digestOf(ids []messages.EventID) []byte {
	s := slices.Clone(ids)
	slices.SortFunc(s, func(a, b messages.EventID) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, id := range s {
		h.Write(id[:])
	}
	return h.Sum(nil)
}

// checkDevices checks every message: committed ones are processed as
// committed at the recipient, not pending there, and cleared at the
// sender (their ACK arrived); pending ones are pending at both ends.
func checkDevices(ctx context.Context, cl hosting.Client, devices []messages.DeviceAddress, committed, pending []msgRef) error {
	recvPending := map[messages.DeviceAddress][]hosting.Message{}
	sentPending := map[messages.DeviceAddress][]hosting.Message{}
	for _, d := range devices {
		p, err := cl.Pending(ctx, d)
		if err != nil {
			return fmt.Errorf("pending of %s: %w", d, err)
		}
		s, err := cl.PendingSent(ctx, d)
		if err != nil {
			return fmt.Errorf("pending sent of %s: %w", d, err)
		}
		recvPending[d], sentPending[d] = p, s
	}
	has := func(ms []hosting.Message, peer messages.DeviceAddress, id messages.LogicalMessageID) *hosting.Message {
		for i := range ms {
			if ms[i].Peer == peer && bytes.Equal(ms[i].ID, id[:]) {
				return &ms[i]
			}
		}
		return nil
	}
	for _, m := range committed {
		p, ok, err := cl.Processed(ctx, m.to, m.from, m.id)
		if err != nil || !ok || p.Status != uint8(persistence.FinalizationCommitted) {
			return fmt.Errorf("committed %s→%s: processed=%v %+v %v", m.from, m.to, ok, p, err)
		}
		if has(recvPending[m.to], m.from, m.id) != nil {
			return fmt.Errorf("committed %s→%s is pending again", m.from, m.to)
		}
		if has(sentPending[m.from], m.to, m.id) != nil {
			return fmt.Errorf("committed %s→%s still pending at its sender", m.from, m.to)
		}
	}
	for _, m := range pending {
		r := has(recvPending[m.to], m.from, m.id)
		if r == nil || !bytes.Equal(r.Body, m.body) {
			return fmt.Errorf("pending %s→%s is not pending at its recipient (%+v)", m.from, m.to, r)
		}
		if has(sentPending[m.from], m.to, m.id) == nil {
			return fmt.Errorf("pending %s→%s is not pending at its sender", m.from, m.to)
		}
		if _, ok, err := cl.Processed(ctx, m.to, m.from, m.id); err != nil || ok {
			return fmt.Errorf("pending %s→%s is processed: %v %v", m.from, m.to, ok, err)
		}
	}
	if n := total(recvPending); n != len(pending) {
		return fmt.Errorf("%d messages pending at recipients, want %d", n, len(pending))
	}
	return nil
}

func total(m map[messages.DeviceAddress][]hosting.Message) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

func sum(c [2]int) int { return c[0] + c[1] }

func split(k string) (kind, identity string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

func idOf(i, j int) messages.LogicalMessageID {
	var id messages.LogicalMessageID
	id[0], id[1], id[2], id[3] = byte(i>>8), byte(i), byte(j>>8), byte(j)
	id[15] = 0x5c
	return id
}

func noteText(group string, i int) string { return fmt.Sprintf("%s note %d", group, i) }

// Writer is an in-memory node signing the events applied on the groups
// (a stand-in for the application's own writer nodes).
type Writer struct {
	n    *runtime.Node
	mu   sync.Mutex // load drivers sign and record from one goroutine per group
	logs map[string][][]byte
}

// NewWriter opens the writer.
func NewWriter(ctx context.Context, mesh []byte) (*Writer, error) {
	n, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: mesh, SyncInterval: -1, Name: "writer"})
	if err != nil {
		return nil, err
	}
	return &Writer{n: n, logs: map[string][][]byte{}}, nil
}

// Key is what a group must trust to accept the writer's events.
func (w *Writer) Key() runtime.PeerKey {
	id := w.n.Identity()
	return runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}
}

// Events signs more new upserts for group (row ids continue) and returns
// every event signed for it so far.
func (w *Writer) Events(group string, more int) ([][]byte, error) {
	evs, err := w.Sign(group, more)
	if err != nil {
		return nil, err
	}
	w.Record(group, evs)
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.logs[group]), nil
}

// Sign signs n new upserts for group without recording them (see
// Record); their row ids continue after the recorded ones.
func (w *Writer) Sign(group string, n int) ([][]byte, error) {
	w.mu.Lock()
	next := len(w.logs[group])
	w.mu.Unlock()
	out := make([][]byte, 0, n)
	for i := 0; i < n; i++ {
		raw, err := w.sign(group, next+i)
		if err != nil {
			return nil, err
		}
		out = append(out, raw)
	}
	return out, nil
}

// Record records signed events of group as applied (what Events returns).
func (w *Writer) Record(group string, evs [][]byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logs[group] = append(w.logs[group], evs...)
}

func (w *Writer) sign(group string, row int) ([]byte, error) {
	key, err := messages.NewValue(int64(row))
	if err != nil {
		return nil, err
	}
	text, err := messages.NewValue(noteText(group, row))
	if err != nil {
		return nil, err
	}
	ev := &messages.Event{Schema: Table.Schema, Table: Table.Table,
		Key: messages.Columns{"id": key}, Payload: messages.Columns{"text": text}}
	return w.n.Sign(ev)
}

// Close closes the writer.
func (w *Writer) Close() error { return w.n.Close() }
