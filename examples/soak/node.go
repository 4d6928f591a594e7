package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// status is the line a child prints every 500 ms (Kind "status"), and
// once more on the parent's "final" command (Kind "final").
type status struct {
	Kind    string `json:"kind"`
	Node    string `json:"node"`
	Events  uint64 `json:"events"` // local log size
	Rows    int    `json:"rows"`
	Digest  string `json:"digest"` // SHA-256 of the table's materialized state
	Loading bool   `json:"loading"`
	// Writes acknowledged and failed since this process started.
	Writes     int `json:"writes"`
	WriteFails int `json:"write_fails"`
	Sent       int `json:"sent"`
	// PendingSent: sent messages waiting for their ACK; PendingRecv:
	// received messages waiting for the application's commit.
	PendingSent int `json:"pending_sent"`
	PendingRecv int `json:"pending_recv"`
	// PendingExcluded: sent messages waiting for their ACK from a node
	// this one was told not to send to.
	PendingExcluded int `json:"pending_excluded"`
	// Backlog is the sum over peers of this node's log entries past the
	// peer's cursor plus the events it re-offers.
	Backlog uint64 `json:"backlog"`
	RSS     int64  `json:"rss"`
	DB      int64  `json:"db"`
	Notices int64  `json:"notices"`
	Missed  uint64 `json:"missed"` // notices reported as NoticesMissed
	Attack  string `json:"attack,omitempty"`
	Err     string `json:"err,omitempty"`

	// Final report.
	EventSet        string `json:"event_set,omitempty"` // SHA-256 of the sorted event ids
	EventCount      int    `json:"event_count,omitempty"`
	AckedChecked    int    `json:"acked_checked,omitempty"`
	AckedMissing    int    `json:"acked_missing,omitempty"`
	MissingExamples string `json:"missing_examples,omitempty"`
	MsgsChecked     int    `json:"msgs_checked,omitempty"`
	MsgsUnfinalized int    `json:"msgs_unfinalized,omitempty"`
	AttackLog       string `json:"attack_log,omitempty"`
}

var items = runtime.TableDef{Schema: "app", Table: "items", KeyColumns: []string{"id"}, Columns: []string{"owner", "n", "t"}}

// appendLog is an append-only line file of the child's own records
// (acknowledged writes, sent and received messages, lag samples), kept
// beside the node directory so a restore of that directory does not lose
// it. Each line is one write(2): a SIGKILL loses no line written before.
type appendLog struct {
	mu sync.Mutex
	f  *os.File
}

func openLog(path string) (*appendLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &appendLog{f: f}, nil
}

func (l *appendLog) line(sync bool, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.f, format+"\n", args...)
	if sync {
		_ = l.f.Sync()
	}
}

// nodeEnv is what runNode and runHostile share: the open node and the
// mesh it is in.
type nodeEnv struct {
	ctx  context.Context
	o    options
	mf   meshFile
	me   member
	n    *runtime.Node
	self runtime.DeviceAddress
}

func openNode(o options) (*nodeEnv, error) {
	ctx := context.Background()
	mf, err := readMesh(o.dir)
	if err != nil {
		return nil, err
	}
	e := &nodeEnv{ctx: ctx, o: o, mf: mf}
	found := false
	var trusted []runtime.PeerKey
	for _, m := range append(slices.Clone(mf.Members), mf.Extra...) {
		if m.Name == o.name {
			e.me, found = m, true
			continue
		}
		var site messages.SiteID
		copy(site[:], m.Site)
		trusted = append(trusted, runtime.PeerKey{Kid: m.Kid, Site: site, PublicKey: m.PublicKey})
	}
	if !found {
		return nil, fmt.Errorf("%s is not in mesh.json", o.name)
	}
	rc := runtime.RemoteConfig{Host: "127.0.0.1"}
	if _, err := fmt.Sscanf(e.me.Address, "127.0.0.1:%d", &rc.Port); err != nil {
		return nil, fmt.Errorf("address %q: %w", e.me.Address, err)
	}
	if rc.TLS, rc.ClientTLS, err = meshtls.LoadNodeTLS(filepath.Join(o.dir, "tls"), o.name); err != nil {
		return nil, err
	}
	e.self = runtime.DeviceAddress{User: o.name, Device: 1}
	cfg := runtime.Config{Dir: filepath.Join(o.dir, o.name), MeshID: meshID, Name: o.name, SyncInterval: o.interval,
		ReconcileInterval: o.reconcile, Remote: &rc, Trusted: trusted, Restored: o.restored,
		// Warnings go to node-N.stderr beside any crash trace.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if o.offset != 0 {
		off := o.offset
		cfg.Wall = func() time.Time { return time.Now().Add(off) }
	}
	if o.messaging {
		cfg.Device = &runtime.DeviceConfig{Address: e.self, Buffer: 256,
			Retry: runtime.RetryPolicy{Interval: time.Second, Backoff: 2, MaxInterval: 10 * time.Second, Jitter: 0.2}}
	}
	if e.n, err = runtime.Open(ctx, cfg); err != nil {
		return nil, err
	}
	if err := e.n.EnsureTable(ctx, items); err != nil {
		e.n.Close()
		return nil, err
	}
	rem := e.n.Remote()
	for _, m := range mf.Members {
		if m.Name == o.name {
			continue
		}
		var site messages.SiteID
		copy(site[:], m.Site)
		if err := rem.AddPeer(m.Name, m.Address); err != nil {
			e.n.Close()
			return nil, err
		}
		if o.messaging {
			if err := rem.AddDevice(e.n, runtime.DeviceAddress{User: m.Name, Device: 1}, m.Address); err != nil {
				e.n.Close()
				return nil, err
			}
		}
		if err := e.n.AddPeer(m.Name, rem, "remote", runtime.PeerSite(site)); err != nil {
			e.n.Close()
			return nil, err
		}
	}
	return e, nil
}

// load is a child's switchable write and send load.
type load struct {
	write, send atomic.Bool
	// busy counts writes and sends in progress: raised before the switch
	// is read and lowered after the call returns, so a status that reads
	// the switch off and then busy 0 knows no write or send is still
	// under way (a Send that takes seconds stores its pending row late).
	busy    atomic.Int64
	exclude atomic.Pointer[map[string]bool]
	writes  atomic.Int64
	fails   atomic.Int64
	sent    atomic.Int64
	notices atomic.Int64
	missed  atomic.Uint64
	lastErr atomic.Pointer[string]
}

func (l *load) fail(err error) {
	l.fails.Add(1)
	s := err.Error()
	l.lastErr.Store(&s)
}

func runNode(o options) error {
	e, err := openNode(o)
	if err != nil {
		return err
	}
	defer e.n.Close()
	var ld load
	ld.write.Store(!o.noWrite)
	ld.send.Store(!o.noSend)
	ex := parseExclude(o.exclude)
	ld.exclude.Store(&ex)
	logs := map[string]*appendLog{}
	for _, k := range []string{"writes", "sent", "recv", "lag"} {
		if logs[k], err = openLog(filepath.Join(o.dir, o.name+"."+k)); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	// Notices: a callback that may be slow (the notice queue bounds what
	// the node holds for it).
	unsub := e.n.Subscribe(func(x messages.Notice) {
		ld.notices.Add(1)
		if m, ok := x.(messages.NoticesMissed); ok {
			ld.missed.Add(m.Count)
		}
		if o.slowNotice > 0 {
			time.Sleep(o.slowNotice)
		}
	})
	defer unsub()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); writeLoop(ctx, e, &ld, logs["writes"]) }()
	go func() { defer wg.Done(); watchLag(ctx, e, logs["lag"]) }()
	if o.messaging {
		wg.Add(2)
		go func() { defer wg.Done(); sendLoop(ctx, e, &ld, logs["sent"]) }()
		go func() { defer wg.Done(); handleMessages(ctx, e, logs["recv"]) }()
	}
	defer wg.Wait()
	defer cancel()

	cmds := make(chan string)
	go func() { // the parent's commands; EOF: close and exit
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	enc := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case c, ok := <-cmds:
			if !ok {
				return nil
			}
			if done, err := command(ctx, e, &ld, c, enc); done || err != nil {
				return err
			}
			continue
		case <-tick.C:
		}
		st := nodeStatus(ctx, e, &ld)
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
}

func parseExclude(s string) map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		if n != "" {
			m[n] = true
		}
	}
	return m
}

// command runs one parent command; done reports that the child should
// exit.
func command(ctx context.Context, e *nodeEnv, ld *load, c string, enc *json.Encoder) (done bool, err error) {
	f := strings.Fields(c)
	if len(f) == 0 {
		return false, nil
	}
	switch f[0] {
	case "write":
		ld.write.Store(len(f) > 1 && f[1] == "on")
	case "send":
		ld.send.Store(len(f) > 1 && f[1] == "on")
	case "exclude":
		ex := parseExclude(strings.Join(f[1:], ","))
		ld.exclude.Store(&ex)
	case "final":
		ld.write.Store(false)
		ld.send.Store(false)
		st := finalReport(ctx, e, ld)
		return false, enc.Encode(st)
	}
	return false, nil
}

func nodeStatus(ctx context.Context, e *nodeEnv, ld *load) status {
	st := status{Kind: "status", Node: e.o.name, Writes: int(ld.writes.Load()), WriteFails: int(ld.fails.Load()), Sent: int(ld.sent.Load()),
		Loading: ld.write.Load() || (e.o.messaging && ld.send.Load()) || ld.busy.Load() > 0, Notices: ld.notices.Load(), Missed: ld.missed.Load()}
	if p := ld.lastErr.Load(); p != nil {
		st.Err = *p
	}
	var err error
	if st.Rows, st.Digest, err = digest(ctx, e.n); err != nil {
		st.Err = err.Error()
	}
	st.Events, _ = e.n.LastSeq(ctx)
	if peers, err := e.n.PeerReports(ctx); err == nil {
		for _, p := range peers {
			if p.Peer != "hostile" {
				st.Backlog += p.LagEvents
			}
		}
	}
	if e.o.messaging {
		st.PendingSent = countPendingSent(ctx, e.n, nil)
		var err error
		if st.PendingRecv, err = e.n.PendingReceivedMessageCount(ctx, nil); err != nil {
			st.PendingRecv = -1 // unknown is not none
		}
		for name := range *ld.exclude.Load() {
			to := runtime.DeviceAddress{User: name, Device: 1}
			c := countPendingSent(ctx, e.n, &to)
			if c < 0 {
				st.PendingExcluded = -1
				break
			}
			st.PendingExcluded += c
		}
	}
	st.RSS = rss()
	if fi, err := os.Stat(filepath.Join(e.o.dir, e.o.name, "node.db")); err == nil {
		st.DB = fi.Size()
	}
	return st
}

// rss is this process's resident set size (Linux: /proc/self/status).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func digest(ctx context.Context, n *runtime.Node) (int, string, error) {
	h := sha256.New()
	rows := 0
	for r, err := range n.Rows(ctx, "app", "items", runtime.ScanOptions{IncludeDeleted: true}) {
		if err != nil {
			return rows, "", err
		}
		if r.Exists {
			rows++
		}
		fmt.Fprintf(h, "%x %v %v %v|", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
		for _, c := range items.Columns {
			cell := r.Cells[c]
			fmt.Fprintf(h, "%s %v %x %v|", c, cell.State, []byte(cell.Value), cell.Clock)
		}
	}
	return rows, hex.EncodeToString(h.Sum(nil)), nil
}

// writeLoop writes wps rows a second to random shared keys; each
// acknowledged write is logged (time, latency, the event's id).
func writeLoop(ctx context.Context, e *nodeEnv, ld *load, log *appendLog) {
	if e.o.wps <= 0 {
		return
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / e.o.wps))
	defer tick.Stop()
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ld.busy.Add(1)
		if !ld.write.Load() {
			ld.busy.Add(-1)
			continue
		}
		t0 := time.Now()
		out, err := e.n.Upsert(ctx, "app", "items", map[string]any{"id": rng.IntN(e.o.keys)},
			map[string]any{"owner": e.o.name, "n": k, "t": t0.UnixMilli()})
		lat := time.Since(t0)
		ld.busy.Add(-1)
		if err != nil {
			if ctx.Err() == nil {
				ld.fail(err)
			}
			continue
		}
		ld.writes.Add(1)
		log.line(false, "%d %d %x", t0.UnixMilli(), lat.Microseconds(), out.ID[:])
	}
}

// watchLag records, for every row change another node's write caused,
// how long after that write this node saw it (the writer's wall time is
// in the row's "t").
func watchLag(ctx context.Context, e *nodeEnv, log *appendLog) {
	after, err := e.n.LastChangeSeq(ctx)
	if err != nil {
		return
	}
	for {
		for c, err := range e.n.Watch(ctx, "app", "items", after) {
			if err != nil {
				var lag *runtime.WatchLagError
				if errors.As(err, &lag) {
					after, _ = e.n.LastChangeSeq(ctx)
				}
				break
			}
			after = c.Seq
			if c.Cause != runtime.CauseEvent {
				continue
			}
			var owner string
			var t int64
			if oc, ok := c.Cells["owner"]; !ok || oc.Value.Decode(&owner) != nil || owner == e.o.name {
				continue
			}
			if tc, ok := c.Cells["t"]; !ok || tc.Value.Decode(&t) != nil {
				continue
			}
			log.line(false, "%d %d %s", time.Now().UnixMilli(), time.Now().UnixMilli()-t, owner)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sendLoop sends mps messages a second, each to a random other node; the
// body starts with the send time in µs.
func sendLoop(ctx context.Context, e *nodeEnv, ld *load, log *appendLog) {
	if e.o.mps <= 0 {
		return
	}
	var others []string
	for _, m := range e.mf.Members {
		if m.Name != e.o.name {
			others = append(others, m.Name)
		}
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / e.o.mps))
	defer tick.Stop()
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ld.busy.Add(1)
		if ld.send.Load() {
			sendOne(ctx, e, ld, log, others, rng)
		}
		ld.busy.Add(-1)
	}
}

// sendOne sends one message to a random node not excluded and logs it.
func sendOne(ctx context.Context, e *nodeEnv, ld *load, log *appendLog, others []string, rng *mrand.Rand) {
	ex := *ld.exclude.Load()
	var to []string
	for _, n := range others {
		if !ex[n] {
			to = append(to, n)
		}
	}
	if len(to) == 0 {
		return
	}
	dest := to[rng.IntN(len(to))]
	body := make([]byte, 64)
	binary.BigEndian.PutUint64(body, uint64(time.Now().UnixMicro()))
	sm, err := e.n.Send(ctx, runtime.DeviceAddress{User: dest, Device: 1}, body)
	if err != nil && !errors.Is(err, runtime.ErrNotHandedOff) {
		if ctx.Err() == nil {
			ld.fail(err)
		}
		return
	}
	ld.sent.Add(1)
	log.line(false, "%d %s %x", time.Now().UnixMilli(), dest, sm.ID[:])

}

// handleMessages is the application: it logs every hand-off (fsynced)
// before it commits 90 % of the messages and discards 10 % (chosen by
// id), then logs the outcome.
func handleMessages(ctx context.Context, e *nodeEnv, log *appendLog) {
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-e.n.Messages():
			if !ok {
				return
			}
			sentUS := int64(0)
			if len(m.Plaintext) >= 8 {
				sentUS = int64(binary.BigEndian.Uint64(m.Plaintext))
			}
			now := time.Now()
			log.line(true, "D %d %s %x %d %d", now.UnixMilli(), m.Sender.User, m.ID[:], (now.UnixMicro()-sentUS)/1000, m.Deliveries)
			var res runtime.CommitResult
			var err error
			if m.ID[len(m.ID)-1] < 26 { // ~10 % (the id's last byte is random; its first bytes are a timestamp)
				res, err = e.n.DiscardMessage(ctx, m, runtime.DiscardRejectedByPolicy)
			} else {
				res, err = e.n.CommitMessage(ctx, m)
			}
			if err != nil {
				log.line(false, "E %d %s %x %v", time.Now().UnixMilli(), m.Sender.User, m.ID[:], strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			log.line(false, "F %d %s %x %s", time.Now().UnixMilli(), m.Sender.User, m.ID[:], outcomeName(res))
		}
	}
}

// countPendingSent counts the sent messages still waiting for their ACK
// (to *to when to is not nil); a listing error makes it -1 (unknown is
// not none: convergence and the copy wait for a count of 0).
func countPendingSent(ctx context.Context, n *runtime.Node, to *runtime.DeviceAddress) int {
	c := 0
	for _, err := range n.PendingSent(ctx, 0, to) {
		if err != nil {
			return -1
		}
		c++
	}
	return c
}

func outcomeName(res runtime.CommitResult) string {
	switch res.Status {
	case runtime.Committed:
		return "committed"
	case runtime.Discarded:
		return "discarded"
	case runtime.AlreadyCommitted:
		return "already-committed"
	case runtime.AlreadyDiscarded:
		return "already-discarded"
	}
	return fmt.Sprint(res.Status)
}

// finalReport checks this node against every child's records: its event
// set holds every acknowledged write of every node, and every message
// sent to it was finalized here.
func finalReport(ctx context.Context, e *nodeEnv, ld *load) status {
	st := nodeStatus(ctx, e, ld)
	st.Kind = "final"
	ids := map[messages.EventID]bool{}
	var sorted []messages.EventID
	for le, err := range e.n.LogEntries(ctx, 0) {
		if err != nil {
			st.Err = err.Error()
			return st
		}
		if le.Schema == items.Schema && le.Table == items.Table && !ids[le.ID] {
			ids[le.ID] = true
			sorted = append(sorted, le.ID)
		}
	}
	slices.SortFunc(sorted, func(a, b messages.EventID) int { return strings.Compare(string(a[:]), string(b[:])) })
	h := sha256.New()
	for _, id := range sorted {
		h.Write(id[:])
	}
	st.EventSet, st.EventCount = hex.EncodeToString(h.Sum(nil)), len(sorted)
	var missing []string
	for _, m := range e.mf.Members {
		forLines(filepath.Join(e.o.dir, m.Name+".writes"), func(f []string) {
			if len(f) < 3 {
				return
			}
			b, err := hex.DecodeString(f[2])
			if err != nil || len(b) != len(messages.EventID{}) {
				return
			}
			var id messages.EventID
			copy(id[:], b)
			st.AckedChecked++
			if !ids[id] {
				st.AckedMissing++
				if len(missing) < 5 {
					missing = append(missing, m.Name+":"+f[2][:16]+"@"+f[0])
				}
			}
		})
	}
	st.MissingExamples = strings.Join(missing, " ")
	if !e.o.messaging {
		return st
	}
	// A message counts as finalized here if the node holds its processed
	// record, or if this application logged its commit or discard (a
	// restore from a copy forgets records made after the copy).
	appFinal := map[string]bool{}
	forLines(filepath.Join(e.o.dir, e.o.name+".recv"), func(f []string) {
		if len(f) >= 5 && f[0] == "F" && (f[4] == "committed" || f[4] == "discarded") {
			appFinal[f[2]+" "+f[3]] = true
		}
	})
	for _, m := range e.mf.Members {
		forLines(filepath.Join(e.o.dir, m.Name+".sent"), func(f []string) {
			if len(f) < 3 || f[1] != e.o.name {
				return
			}
			b, err := hex.DecodeString(f[2])
			if err != nil || len(b) != len(runtime.MessageID{}) {
				return
			}
			var id runtime.MessageID
			copy(id[:], b)
			st.MsgsChecked++
			_, ok, err := e.n.ProcessedMessage(ctx, runtime.DeviceAddress{User: m.Name, Device: 1}, id)
			if err == nil && !ok && !appFinal[m.Name+" "+f[2]] {
				st.MsgsUnfinalized++
			}
		})
	}
	return st
}

// forLines calls fn with the fields of every line of path (none if it
// does not exist).
func forLines(path string, fn func([]string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		fn(strings.Fields(sc.Text()))
	}
}
