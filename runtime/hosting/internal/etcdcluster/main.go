// Command etcdcluster is one process of the etcd crash test of
// runtime/hosting (TestClusterCrashEtcd): members in separate processes on
// a real etcd, so one can be SIGKILLed or SIGSTOPped.
//
//	-mode member: a hosting member (etcdmember provider). It prints one JSON
//	  line per membership change ({"ev":"joined"|"fenced"|"suspended"|
//	  "resumed",...}) on stdout and
//	  leaves gracefully on SIGTERM.
//	-mode driver: a router-only member (ClusterConfig.NoUnits) running load
//	  on groups and devices: every acknowledged reply is written to -out as
//	  a JSON line (unit, member, member id, activation epoch, activation and
//	  serve times). It prints {"ev":"ready",...} once every unit answered;
//	  on "stop" (stdin) it ends the load, checks that every acknowledged
//	  event and every committed message is still there, and prints
//	  {"ev":"report",...}.
//	-mode history: the fault harness's client (TestClusterFaultsEtcd), a
//	  router-only member: group applies, event and row reads, sends,
//	  commits, discards and pending reads between devices, each recorded
//	  as a histcheck.Op line in -out; on "stop" the final reads. Failpoints
//	  planted for the checker to catch: SYNCMESH_FAILPOINT (history.go).
//	  Members of the harness listen on -port, advertise the proxy's
//	  -advertise and dial from -src; -replicas (SYNCMESH_REPLICAS) sets the
//	  units' replication factor where hosting has one (faults.go).
//
// It is a separate program, built without -race, because several
// protoactor remotes in one process trip -race inside protoactor's remote
// (see TestClusterMemberLoss).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/etcdmember"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

var mesh = []byte("etcdcluster-mesh")

type opts struct {
	mode, root, out, tag string
	certs, name          string
	etcd                 []string
	ttl                  time.Duration
	members, routers     int
	groups, devices      int
	quota                int
	verbose              bool
	// The fault harness (TestClusterFaultsEtcd): a fixed remote port, the
	// proxy address advertised instead of it, the loopback address every
	// dial leaves from (so the proxy knows who dials), the replication
	// factor, the client's number and the length of its run.
	port             int
	advertise, src   string
	replicas, client int
	finalTimeout     time.Duration
	// Replication traffic: where it listens and the proxy route to it.
	raftListen, raftAdvertise string
	raftElection              time.Duration
}

func main() {
	var o opts
	var etcd string
	flag.StringVar(&o.mode, "mode", "member", "member or driver")
	flag.StringVar(&o.root, "root", "", "shared data root")
	flag.StringVar(&etcd, "etcd", "", "etcd client URLs, comma-separated")
	flag.DurationVar(&o.ttl, "ttl", 2*time.Second, "lease TTL")
	flag.StringVar(&o.out, "out", "", "driver: reply records (JSON lines)")
	flag.StringVar(&o.tag, "tag", "a", "driver: tag of its events and messages")
	flag.IntVar(&o.members, "members", 3, "driver: hosting members to wait for (and to spread units over)")
	flag.IntVar(&o.routers, "routers", 1, "driver: router-only members to wait for, this one included")
	flag.IntVar(&o.groups, "groups", 3, "driver: groups")
	flag.IntVar(&o.devices, "devices", 6, "driver: devices")
	flag.IntVar(&o.quota, "quota", 0, "member: units per tenant (0: the default)")
	flag.BoolVar(&o.verbose, "v", false, "debug logs on stderr")
	flag.StringVar(&o.certs, "certs", "", "directory of the member certificates (sspctl tls layout); empty: plaintext")
	flag.StringVar(&o.name, "name", "", "this member's certificate name")
	flag.IntVar(&o.port, "port", 0, "remote port (0: any free port)")
	flag.StringVar(&o.advertise, "advertise", "", "host:port other members dial (the fault proxy's route to this process)")
	flag.StringVar(&o.src, "src", "", "loopback address every member-to-member dial leaves from")
	flag.IntVar(&o.replicas, "replicas", replicasFromEnv(), "replication factor of the units (SYNCMESH_REPLICAS; 0 or 1: one copy, today's hosting)")
	flag.StringVar(&o.raftListen, "raft-listen", "", "replication listener (host:port; empty: any loopback port)")
	flag.StringVar(&o.raftAdvertise, "raft-advertise", "", "replication address other members dial (the fault proxy's route)")
	flag.DurationVar(&o.raftElection, "raft-election", 0, "replication election timeout (0: the engine's default)")
	flag.IntVar(&o.client, "client", 0, "history: this client's number")
	flag.DurationVar(&o.finalTimeout, "final-timeout", 10*time.Minute, "history: how long the final reads may take")
	flag.Parse()
	o.etcd = strings.Split(etcd, ",")
	var err error
	switch o.mode {
	case "member":
		err = member(o)
	case "driver":
		err = driver(o)
	case "tenants":
		err = tenants(o)
	case "history":
		err = history(o)
	default:
		err = fmt.Errorf("unknown mode %q", o.mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdcluster:", err)
		os.Exit(1)
	}
}

var outMu sync.Mutex

// emit prints one JSON line on stdout.
func emit(v any) {
	b, _ := json.Marshal(v)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(b))
}

// Event is a line on stdout.
type Event struct {
	Ev     string            `json:"ev"`
	Member string            `json:"member,omitempty"`
	ID     string            `json:"id,omitempty"`
	Reason string            `json:"reason,omitempty"`
	Where  map[string]string `json:"where,omitempty"`
	Report *Report           `json:"report,omitempty"`
	Tenant *TenantReport     `json:"tenant,omitempty"`
	At     int64             `json:"at"`
}

// Report is the driver's final check.
type Report struct {
	EventsAcked int
	Committed   int
	Lost        []string
	Errors      []string
}

func open(o opts, noUnits bool) (*hosting.Cluster, *etcdmember.Provider, error) {
	logger := slog.New(slog.DiscardHandler)
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	prov, err := etcdmember.New(etcdmember.Config{Endpoints: o.etcd, TTL: o.ttl, Logger: logger})
	if err != nil {
		return nil, nil, err
	}
	cc := hosting.ClusterConfig{Plaintext: true, MemberName: o.name}
	if o.certs != "" {
		server, client, err := hosting.MemberTLS(o.certs, o.name)
		if err != nil {
			_ = prov.Close()
			return nil, nil, err
		}
		cc = hosting.ClusterConfig{TLS: server, ClientTLS: client}
	}
	cc.Config = hosting.Config{Root: o.root, MeshID: mesh, NoSync: true, Logger: logger, LockTimeout: 500 * time.Millisecond, TenantQuota: o.quota}
	cc.Name = "syncmesh-etcd-test"
	cc.Provider = prov
	cc.NoUnits = noUnits
	cc.RequestTimeout = 5 * time.Second
	if o.port != 0 {
		cc.Port = o.port
	}
	cc.AdvertisedHost = o.advertise
	if o.src != "" {
		cc.RemoteOptions = append(cc.RemoteOptions, dialFrom(o.src, cc.ClientTLS))
	}
	cc.Replicas = o.replicas
	cc.Replication = hosting.ReplicationConfig{Listen: o.raftListen, Advertise: o.raftAdvertise, ElectionTimeout: o.raftElection}
	cc.OnMembership = func(m hosting.MembershipChange) {
		ev := Event{Ev: "joined", Member: m.Member, ID: m.ID, At: time.Now().UnixNano()}
		switch {
		case m.Suspended:
			ev.Ev, ev.Reason = "suspended", fmt.Sprint(m.Reason)
		case m.Resumed:
			ev.Ev = "resumed"
		case !m.Joined:
			ev.Ev, ev.Reason = "fenced", fmt.Sprint(m.Reason)
		}
		emit(ev)
	}
	c, err := hosting.NewCluster(cc)
	if err != nil {
		_ = prov.Close()
		return nil, nil, err
	}
	return c, prov, nil
}

func member(o opts) error {
	c, prov, err := open(o, false)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	err = c.Close()
	_ = prov.Close()
	emit(Event{Ev: "closed", At: time.Now().UnixNano()})
	return err
}

// driverTenant owns every unit the drivers create.
var driverTenant = hosting.Principal{Tenant: "driver"}

// Record is one acknowledged reply.
type Record struct {
	Unit        string `json:"u"`
	Op          string `json:"op"`
	Member      string `json:"m"`
	MemberID    string `json:"id"`
	Epoch       uint64 `json:"e"`
	ActivatedAt int64  `json:"a"`
	ServedAt    int64  `json:"s"`
	Received    int64  `json:"r"`
	Driver      string `json:"d"`
}

type driverState struct {
	o    opts
	p    hosting.Placement
	w    *scenario.Writer
	recs chan Record
	stop chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	acked     map[string][]messages.EventID
	committed []msg
	errs      []string
}

type msg struct {
	from, to messages.DeviceAddress
	id       messages.LogicalMessageID
}

func driver(o opts) error {
	c, prov, err := open(o, true)
	if err != nil {
		return err
	}
	defer prov.Close()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for len(c.Members()) < o.members+o.routers {
		if ctx.Err() != nil {
			return fmt.Errorf("members: %v", c.Members())
		}
		time.Sleep(50 * time.Millisecond)
	}
	f, err := os.Create(o.out)
	if err != nil {
		return err
	}
	defer f.Close()
	d := &driverState{o: o, p: c, recs: make(chan Record, 1024), stop: make(chan struct{}), acked: map[string][]messages.EventID{}}
	if d.w, err = scenario.NewWriter(ctx, mesh); err != nil {
		return err
	}
	defer d.w.Close()
	written := make(chan struct{})
	go func() {
		// Unbuffered: the test reads the records while the load runs.
		enc := json.NewEncoder(f)
		for r := range d.recs {
			_ = enc.Encode(r)
		}
		close(written)
	}()

	groups := make([]string, o.groups)
	where := map[string]string{}
	cl := hosting.Client{P: c}
	ctx = hosting.WithPrincipal(ctx, driverTenant)
	for i := range groups {
		groups[i] = fmt.Sprintf("tenant%02d", i)
		if _, err := d.request(ctx, hosting.KindGroup, groups[i], &hosting.Request{Op: hosting.OpCreate}); err != nil {
			return err
		}
		if err := cl.Trust(ctx, groups[i], d.w.Key()); err != nil {
			return err
		}
		if err := cl.DefineTable(ctx, groups[i], scenario.Table); err != nil {
			return err
		}
		rep, err := d.request(ctx, hosting.KindGroup, groups[i], &hosting.Request{Op: hosting.OpInfo})
		if err != nil {
			return err
		}
		where[hosting.KindGroup+"/"+groups[i]] = rep.Member
	}
	// At least -devices devices, more until every hosting member hosts a
	// unit (placement hashes the identities).
	var devices []messages.DeviceAddress
	for i := 0; ; i++ {
		if len(devices) >= o.devices && spread(where) >= o.members || len(devices) >= 40 {
			break
		}
		dev := messages.DeviceAddress{User: fmt.Sprintf("user%02d", i), Device: 1}
		id := hosting.DeviceIdentity(dev)
		rep, err := d.request(ctx, hosting.KindDevice, id, &hosting.Request{Op: hosting.OpCreate})
		if err != nil {
			return err
		}
		devices = append(devices, dev)
		where[hosting.KindDevice+"/"+id] = rep.Member
	}
	emit(Event{Ev: "ready", Where: where, At: time.Now().UnixNano()})

	for _, g := range groups {
		d.wg.Add(1)
		go d.groupLoad(ctx, g)
	}
	for i := range devices {
		d.wg.Add(1)
		go d.deviceLoad(ctx, i, devices[i], devices[(i+1)%len(devices)])
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "stop" {
			break
		}
	}
	close(d.stop)
	d.wg.Wait()
	rep := d.verify(ctx, groups)
	close(d.recs)
	<-written
	emit(Event{Ev: "report", Report: rep, At: time.Now().UnixNano()})
	return nil
}

// spread counts the members hosting units.
func spread(where map[string]string) int {
	n := map[string]bool{}
	for _, m := range where {
		n[m] = true
	}
	return len(n)
}

// request sends req until it is acknowledged (every operation is
// idempotent) and records the reply.
func (d *driverState) request(ctx context.Context, kind, identity string, req *hosting.Request) (*hosting.Reply, error) {
	if req.Principal == nil {
		req.Principal = &driverTenant
	}
	var first error
	for {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		rep, err := d.p.Request(rctx, kind, identity, req)
		cancel()
		if err == nil {
			d.recs <- Record{Unit: kind + "/" + identity, Op: req.Op.String(), Member: rep.Member, MemberID: rep.MemberID,
				Epoch: rep.Epoch, ActivatedAt: rep.ActivatedAt, ServedAt: rep.ServedAt, Received: time.Now().UnixNano(), Driver: d.o.tag}
			return rep, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil || !errors.Is(err, hosting.ErrUnavailable) {
			return nil, fmt.Errorf("%s %s/%s: %w (first: %v)", req.Op, kind, identity, err, first)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *driverState) fail(err error) {
	fmt.Fprintln(os.Stderr, "driver:", err) // the test shows it if the load stops
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, err.Error())
}

func (d *driverState) stopped() bool {
	select {
	case <-d.stop:
		return true
	default:
		return false
	}
}

func (d *driverState) groupLoad(ctx context.Context, g string) {
	defer d.wg.Done()
	for !d.stopped() {
		evs, err := d.w.Sign(g, 1)
		if err != nil {
			d.fail(err)
			return
		}
		rep, err := d.request(ctx, hosting.KindGroup, g, &hosting.Request{Op: hosting.OpApply, Events: evs})
		if err != nil {
			d.fail(err)
			return
		}
		if len(rep.Outcomes) != 1 || (rep.Outcomes[0].Kind != uint8(messages.Applied) && rep.Outcomes[0].Kind != uint8(messages.Duplicate)) {
			d.fail(fmt.Errorf("apply on %s: %+v", g, rep.Outcomes))
			return
		}
		d.w.Record(g, evs)
		var id messages.EventID
		copy(id[:], rep.Outcomes[0].ID)
		d.mu.Lock()
		d.acked[g] = append(d.acked[g], id)
		d.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *driverState) deviceLoad(ctx context.Context, i int, from, to messages.DeviceAddress) {
	defer d.wg.Done()
	for k := 0; !d.stopped(); k++ {
		var id messages.LogicalMessageID
		copy(id[:], d.o.tag)
		id[8], id[9], id[10], id[11] = byte(i), byte(k>>16), byte(k>>8), byte(k)
		peer := to
		if _, err := d.request(ctx, hosting.KindDevice, hosting.DeviceIdentity(from), &hosting.Request{Op: hosting.OpSend, Peer: &peer, ID: id[:], Body: []byte("load")}); err != nil {
			if !errors.Is(err, runtime.ErrNotHandedOff) || ctx.Err() != nil {
				d.fail(err)
				return
			}
			// Not handed off (the recipient was moving): the message is
			// pending at its sender; send it again.
			k--
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for {
			sender := from
			rep, err := d.request(ctx, hosting.KindDevice, hosting.DeviceIdentity(to), &hosting.Request{Op: hosting.OpCommit, Peer: &sender, ID: id[:]})
			if err != nil {
				d.fail(err)
				return
			}
			if len(rep.Messages) == 1 && rep.Messages[0].AckSent {
				break
			}
			time.Sleep(20 * time.Millisecond) // the ACK did not reach the sender's host: commit again
		}
		d.mu.Lock()
		d.committed = append(d.committed, msg{from: from, to: to, id: id})
		d.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
}

// verify checks that every acknowledged event is retained by its group
// and every committed message is processed as committed.
func (d *driverState) verify(ctx context.Context, groups []string) *Report {
	rep := &Report{Errors: d.errs}
	cl := hosting.Client{P: d.p}
	ctx = hosting.WithPrincipal(ctx, driverTenant)
	for _, g := range groups {
		ids, err := cl.EventIDs(ctx, g)
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			continue
		}
		for _, id := range d.acked[g] {
			rep.EventsAcked++
			if !slices.Contains(ids, id) {
				rep.Lost = append(rep.Lost, fmt.Sprintf("event %x of %s", id[:8], g))
			}
		}
	}
	for _, m := range d.committed {
		rep.Committed++
		p, ok, err := cl.Processed(ctx, m.to, m.from, m.id)
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			continue
		}
		if !ok || p.Status != uint8(persistence.FinalizationCommitted) {
			rep.Lost = append(rep.Lost, fmt.Sprintf("commit %s→%s %x", m.from, m.to, m.id[8:]))
		}
	}
	return rep
}
