// Package scenario is the member-loss scenario of runtime/hosting
// (scale-out): devices and sync groups hosted across the members of a
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

// Tenant is the principal the scenario acts for (unless its context
// carries one).
var Tenant = hosting.Principal{Tenant: "scenario"}

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
// violated guarantee. Its phases, in order: place units on every member,
// apply events on every group, exchange messages between the devices,
// stop the victim under load, check the survivors' takeover.
func Run(ctx context.Context, env Env) (Report, error) {
	r := &run{env: env, logf: env.Logf, rep: Report{UnitsPerMember: map[string]int{}, MovedTo: map[string]string{}}}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	if len(env.Members) < 2 {
		return r.rep, errors.New("scenario: needs at least 2 members")
	}
	r.cl = hosting.Client{P: env.Members[0]}
	if _, ok := hosting.PrincipalFrom(ctx); !ok {
		// Every unit is the scenario tenant's: it creates them all.
		ctx = hosting.WithPrincipal(ctx, Tenant)
	}
	if err := r.placeUnits(ctx); err != nil {
		return r.rep, err
	}
	w, err := NewWriter(ctx, env.MeshID)
	if err != nil {
		return r.rep, err
	}
	defer w.Close()
	r.w = w
	for _, phase := range []func(context.Context) error{r.applyEvents, r.exchangeMessages, r.stopVictimUnderLoad, r.checkTakeover} {
		if err := phase(ctx); err != nil {
			return r.rep, err
		}
	}
	return r.rep, nil
}

// run is the state one scenario carries from phase to phase.
type run struct {
	env  Env
	logf func(format string, args ...any)
	rep  Report
	cl   hosting.Client // routes the requests: member 0, a survivor after the stop
	w    *Writer

	devices []messages.DeviceAddress
	groups  []string
	where   map[string]string // "kind/identity" → member
	victim  int               // index of the member stopped

	acked              map[string][]messages.EventID // group → events acknowledged
	digests            map[string][]byte             // group → digest of acked
	committed, pending []msgRef
}

// placeUnits (phase 1) hosts devices and groups until every member hosts
// at least one unit and some member hosts both a device and a group
// (placement is by hash of the identity, so it grows the set rather than
// assume), picks that member as the victim, and checks each member's own
// list agrees with what the units reported.
func (r *run) placeUnits(ctx context.Context) error {
	r.where = map[string]string{}
	for i := 0; ; i++ {
		if len(r.devices) >= 6 && len(r.groups) >= 3 {
			if v, ok := r.spread(); ok {
				r.victim = v
				break
			}
		}
		if len(r.devices)+len(r.groups) >= maxUnits {
			return fmt.Errorf("scenario: %d units not spread over the members: %v", maxUnits, r.perMember())
		}
		if err := r.activate(ctx, i%2 == 0); err != nil {
			return err
		}
	}
	r.reportPlacement()
	for _, p := range r.env.Members {
		for _, u := range p.Hosted() {
			if mem, ok := r.where[u.Kind+"/"+u.Identity]; ok && mem != p.Member() {
				return fmt.Errorf("%s/%s reported member %s but is open on %s", u.Kind, u.Identity, mem, p.Member())
			}
		}
	}
	r.logf("units per member: %v; victim %s hosts devices %v groups %v", r.rep.UnitsPerMember, r.rep.Victim, r.rep.VictimDevices, r.rep.VictimGroups)
	return nil
}

// activate hosts one more device and, with group, one more group,
// recording the member each landed on.
func (r *run) activate(ctx context.Context, group bool) error {
	d := messages.DeviceAddress{User: fmt.Sprintf("user%02d", len(r.devices)), Device: 1}
	mem, err := r.cl.Create(ctx, hosting.KindDevice, hosting.DeviceIdentity(d))
	if err != nil {
		return fmt.Errorf("activate device %s: %w", d, err)
	}
	r.devices = append(r.devices, d)
	r.where[hosting.KindDevice+"/"+hosting.DeviceIdentity(d)] = mem
	if !group {
		return nil
	}
	g := fmt.Sprintf("tenant%02d", len(r.groups))
	mem, err = r.cl.Create(ctx, hosting.KindGroup, g)
	if err != nil {
		return fmt.Errorf("activate group %s: %w", g, err)
	}
	r.groups = append(r.groups, g)
	r.where[hosting.KindGroup+"/"+g] = mem
	return nil
}

// perMember counts each member's units: [devices, groups].
func (r *run) perMember() map[string][2]int {
	m := map[string][2]int{}
	for _, p := range r.env.Members {
		m[p.Member()] = [2]int{}
	}
	for k, mem := range r.where {
		c := m[mem]
		if isDevice(k) {
			c[0]++
		} else {
			c[1]++
		}
		m[mem] = c
	}
	return m
}

// spread picks the victim once every member hosts a unit: the member
// other than 0 (which routes the scenario's requests) hosting the most
// units, at least two devices and a group.
func (r *run) spread() (victim int, ok bool) {
	pm := r.perMember()
	best := -1
	for i, p := range r.env.Members {
		c := pm[p.Member()]
		if c[0]+c[1] == 0 {
			return 0, false
		}
		if i > 0 && c[0] >= 2 && c[1] >= 1 && (best < 0 || c[0]+c[1] > sum(pm[r.env.Members[best].Member()])) {
			best = i
		}
	}
	return best, best > 0
}

// reportPlacement fills in the report's units and the victim's.
func (r *run) reportPlacement() {
	r.rep.Devices, r.rep.Groups = len(r.devices), len(r.groups)
	r.rep.Victim = r.env.Members[r.victim].Member()
	for k, mem := range r.where {
		r.rep.UnitsPerMember[mem]++
		if mem != r.rep.Victim {
			continue
		}
		if isDevice(k) {
			r.rep.VictimDevices = append(r.rep.VictimDevices, k)
		} else {
			r.rep.VictimGroups = append(r.rep.VictimGroups, k)
		}
	}
	sort.Strings(r.rep.VictimDevices)
	sort.Strings(r.rep.VictimGroups)
}

// applyEvents (phase 2, sync plane) applies signed events on every group,
// through different members (any member routes to the unit's host), and
// checks every group retains what was acknowledged.
func (r *run) applyEvents(ctx context.Context) error {
	r.acked = map[string][]messages.EventID{}
	for gi, g := range r.groups {
		if err := r.applyOnGroup(ctx, hosting.Client{P: r.env.Members[gi%len(r.env.Members)]}, g); err != nil {
			return err
		}
	}
	r.digests = map[string][]byte{}
	for _, g := range r.groups {
		n, h, _, err := r.cl.Digest(ctx, g)
		if err != nil {
			return err
		}
		if n != uint64(len(r.acked[g])) {
			return fmt.Errorf("group %s retains %d events, %d acknowledged", g, n, len(r.acked[g]))
		}
		r.digests[g] = h
	}
	r.logf("applied %d events on %d groups", r.rep.EventsAcked, len(r.groups))
	return nil
}

// applyOnGroup trusts the writer on g, defines the table and applies
// eventsPerGroup events in two batches via the given client.
func (r *run) applyOnGroup(ctx context.Context, via hosting.Client, g string) error {
	if err := via.Trust(ctx, g, r.w.Key()); err != nil {
		return fmt.Errorf("trust on %s: %w", g, err)
	}
	if err := via.DefineTable(ctx, g, Table); err != nil {
		return fmt.Errorf("define on %s: %w", g, err)
	}
	evs, err := r.w.Events(g, eventsPerGroup)
	if err != nil {
		return err
	}
	for _, batch := range [][][]byte{evs[:eventsPerGroup/2], evs[eventsPerGroup/2:]} {
		outs, _, err := via.Apply(ctx, g, batch)
		if err != nil {
			return fmt.Errorf("apply on %s: %w", g, err)
		}
		for _, o := range outs {
			if o.Kind != messages.Applied {
				return fmt.Errorf("apply on %s: outcome %v", g, o)
			}
			r.acked[g] = append(r.acked[g], o.ID)
			r.rep.EventsAcked++
		}
	}
	return nil
}

// exchangeMessages (phase 3, delivery plane): each device sends two
// messages to the next one; the first is committed by its recipient, the
// second stays pending.
func (r *run) exchangeMessages(ctx context.Context) error {
	for i, from := range r.devices {
		to := r.devices[(i+1)%len(r.devices)]
		for j := 0; j < 2; j++ {
			m := msgRef{from: from, to: to, id: idOf(i, j), body: []byte(fmt.Sprintf("%s→%s #%d", from, to, j))}
			if _, err := r.cl.Send(ctx, from, to, m.id, m.body); err != nil {
				return fmt.Errorf("send %s→%s: %w", from, to, err)
			}
			if j == 0 {
				r.committed = append(r.committed, m)
			} else {
				r.pending = append(r.pending, m)
			}
		}
	}
	for _, m := range r.committed {
		res, err := r.cl.Commit(ctx, m.to, m.from, m.id)
		if err != nil {
			return fmt.Errorf("commit at %s: %w", m.to, err)
		}
		if res.Status != uint8(runtime.Committed) || !res.AckSent {
			return fmt.Errorf("commit at %s: status %d ack %v", m.to, res.Status, res.AckSent)
		}
	}
	r.rep.Committed, r.rep.Pending = len(r.committed), len(r.pending)
	if err := checkDevices(ctx, r.cl, r.devices, r.committed, r.pending); err != nil {
		return fmt.Errorf("before the stop: %w", err)
	}
	r.logf("%d messages committed, %d pending", len(r.committed), len(r.pending))
	return nil
}

// stopVictimUnderLoad (phase 4) stops the victim while requests for its
// units are in flight (routed through member 0, a survivor): each is
// retried until it is acknowledged, so every one must be there after the
// takeover. What the load got acknowledged joins what is checked.
func (r *run) stopVictimUnderLoad(ctx context.Context) error {
	ld, loadEvents, err := r.startLoad(ctx)
	if err != nil {
		return err
	}
	time.Sleep(20 * time.Millisecond) // let the load start
	t0 := time.Now()
	if err := r.env.Stop(r.victim); err != nil {
		close(ld.stopped)
		ld.wg.Wait()
		return fmt.Errorf("stop member %s: %w", r.rep.Victim, err)
	}
	r.rep.StopTook = time.Since(t0)
	close(ld.stopped)
	ld.wg.Wait()
	if ld.err != nil {
		return fmt.Errorf("load during the stop: %w", ld.err)
	}
	for g, ids := range ld.acked {
		r.acked[g] = append(r.acked[g], ids...)
		r.rep.EventsAcked += len(ids)
		r.w.Record(g, loadEvents[g][:len(ids)])
	}
	r.committed = append(r.committed, ld.committed...)
	r.rep.Committed = len(r.committed)
	r.rep.LoadEvents, r.rep.LoadMessages = ld.events, len(ld.committed)
	r.logf("stopped %s in %v; meanwhile %d events applied and %d messages committed on its units", r.rep.Victim, r.rep.StopTook, ld.events, len(ld.committed))
	// Digests now include the events applied during the stop.
	for _, g := range r.groups {
		r.digests[g] = digestOf(r.acked[g])
	}
	return nil
}

// startLoad starts the load on the victim's units: signed events on its
// groups, messages from its devices to a device hosted elsewhere. It
// returns the events signed per group (recorded once acknowledged).
func (r *run) startLoad(ctx context.Context) (*load, map[string][][]byte, error) {
	var recipient messages.DeviceAddress
	for _, d := range r.devices {
		if r.where[hosting.KindDevice+"/"+hosting.DeviceIdentity(d)] != r.rep.Victim {
			recipient = d
			break
		}
	}
	ld := &load{cl: r.cl, stopped: make(chan struct{})}
	loadEvents := map[string][][]byte{}
	for _, k := range r.rep.VictimGroups {
		_, g := split(k)
		evs, err := r.w.Sign(g, loadOps)
		if err != nil {
			return nil, nil, err
		}
		loadEvents[g] = evs
		ld.group(ctx, g, evs)
	}
	for i, k := range r.rep.VictimDevices {
		_, id := split(k)
		from, err := hosting.ParseDeviceIdentity(id)
		if err != nil {
			return nil, nil, err
		}
		ld.device(ctx, from, recipient, 2000+i)
	}
	return ld, loadEvents, nil
}

// checkTakeover (phase 5): survivors take over from the persisted state.
// Every unit answers from a survivor; every acknowledged event and commit
// is there; repeats stay idempotent; the taken-over units keep working.
func (r *run) checkTakeover(ctx context.Context) error {
	t1 := time.Now()
	survivor := 0
	if r.victim == 0 {
		survivor = 1
	}
	r.cl = hosting.Client{P: r.env.Members[survivor]}
	for k := range r.where {
		kind, id := split(k)
		mem, err := r.cl.Info(ctx, kind, id)
		if err != nil {
			return fmt.Errorf("after the stop, %s: %w", k, err)
		}
		if mem == r.rep.Victim {
			return fmt.Errorf("after the stop, %s still answers from %s", k, mem)
		}
		if r.where[k] == r.rep.Victim {
			r.rep.MovedTo[k] = mem
		}
	}
	r.rep.TakeoverTook = time.Since(t1)
	for _, g := range r.groups {
		if err := r.checkGroupAfterStop(ctx, g); err != nil {
			return err
		}
	}
	if err := checkDevices(ctx, r.cl, r.devices, r.committed, r.pending); err != nil {
		return fmt.Errorf("after the stop: %w", err)
	}
	// Repeats across the takeover stay idempotent.
	for _, m := range r.committed {
		res, err := r.cl.Commit(ctx, m.to, m.from, m.id)
		if err != nil || res.Status != uint8(runtime.AlreadyCommitted) {
			return fmt.Errorf("after the stop, commit again at %s: %+v %v", m.to, res, err)
		}
	}
	if err := r.checkTakenOverUnitsWork(ctx); err != nil {
		return err
	}
	r.logf("survivors took over %d units in %v; all checks passed", len(r.rep.MovedTo), r.rep.TakeoverTook)
	return nil
}

// checkGroupAfterStop checks group g after the takeover: it retains
// exactly the acknowledged events, re-applying them is a no-op
// (idempotent by event id), and its rows read back.
func (r *run) checkGroupAfterStop(ctx context.Context, g string) error {
	n, h, _, err := r.cl.Digest(ctx, g)
	if err != nil {
		return err
	}
	if n != uint64(len(r.acked[g])) || !bytes.Equal(h, r.digests[g]) {
		return fmt.Errorf("after the stop, group %s retains %d events (digest %x), before %d (%x)", g, n, h, len(r.acked[g]), r.digests[g])
	}
	ids, err := r.cl.EventIDs(ctx, g)
	if err != nil {
		return err
	}
	for _, id := range r.acked[g] {
		if !slices.Contains(ids, id) {
			return fmt.Errorf("after the stop, group %s lost event %s", g, id)
		}
	}
	evs, err := r.w.Events(g, 0)
	if err != nil {
		return err
	}
	outs, _, err := r.cl.Apply(ctx, g, evs)
	if err != nil {
		return err
	}
	for _, o := range outs {
		if o.Kind != messages.Duplicate {
			return fmt.Errorf("after the stop, re-applying on %s: %v", g, o)
		}
	}
	row, found, err := r.cl.Get(ctx, g, Table.Schema, Table.Table, map[string]any{"id": int64(eventsPerGroup - 1)})
	if err != nil || !found {
		return fmt.Errorf("after the stop, row of %s: found=%v %v", g, found, err)
	}
	var text string
	if err := row.Cells["text"].Decode(&text); err != nil || text != noteText(g, eventsPerGroup-1) {
		return fmt.Errorf("after the stop, row of %s: %q %v", g, text, err)
	}
	return nil
}

// checkTakenOverUnitsWork: the victim's units keep working on their new
// hosts: a new event on each group, a new message from each device.
func (r *run) checkTakenOverUnitsWork(ctx context.Context) error {
	for _, k := range append(append([]string(nil), r.rep.VictimGroups...), r.rep.VictimDevices...) {
		kind, id := split(k)
		if kind == hosting.KindGroup {
			evs, err := r.w.Events(id, 1)
			if err != nil {
				return err
			}
			outs, _, err := r.cl.Apply(ctx, id, evs[len(evs)-1:])
			if err != nil || outs[0].Kind != messages.Applied {
				return fmt.Errorf("after the stop, new event on %s: %v %v", id, outs, err)
			}
			continue
		}
		from, _ := hosting.ParseDeviceIdentity(id)
		to := r.devices[0]
		if to == from {
			to = r.devices[1]
		}
		mid := idOf(1000, int(from.User[len(from.User)-1]))
		if _, err := r.cl.Send(ctx, from, to, mid, []byte("after the takeover")); err != nil {
			return fmt.Errorf("after the stop, send from %s: %w", from, err)
		}
		res, err := r.cl.Commit(ctx, to, from, mid)
		if err != nil || res.Status != uint8(runtime.Committed) {
			return fmt.Errorf("after the stop, commit at %s: %+v %v", to, res, err)
		}
	}
	return nil
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

// isDevice tells a "kind/identity" key of a device from a group's.
func isDevice(k string) bool { return k[:len(hosting.KindDevice)] == hosting.KindDevice }

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
