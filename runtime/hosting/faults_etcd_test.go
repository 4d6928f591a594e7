package hosting_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdtest"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/faultproxy"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/histcheck"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/membercerts"
)

// faultRounds is how many rounds of faults TestClusterFaultsEtcd runs
// (each: a SIGKILL and restart, a SIGSTOP past the lease, a partition);
// the soak build (make soak) runs many more.
var faultRounds = 1

// checkTimeout bounds the linearizability check of one unit's history (a
// soak's histories are long, and the machine is shared).
var checkTimeout = 2 * time.Minute

// faultReplicas is the units' replication factor of the fault harness:
// SYNCMESH_REPLICAS (0 or 1: one copy; 3: ClusterConfig.Replicas 3).
func faultReplicas() int {
	n, _ := strconv.Atoi(os.Getenv("SYNCMESH_REPLICAS"))
	return n
}

// faultNode is one process of the fault harness: its remote listens on
// port, every other process reaches it through the proxy at addr, it
// dials from ip, and reaches etcd through its own route etcd.
type faultNode struct {
	name, ip   string
	port       int
	addr, etcd string
	// raftPort and raftAddr: the replication listener and the proxy's
	// route to it (replicated runs).
	raftPort int
	raftAddr string
	c        *child
}

// faultCluster is etcd, the proxy and the processes of one fault test.
type faultCluster struct {
	t           *testing.T
	exe         string
	proxy       *faultproxy.Proxy
	etcd        string
	root, certs string
	replicas    int
	members     []*faultNode
	byAddr      map[string]*faultNode
	clients     int
}

func newFaultCluster(t *testing.T, members, replicas int) *faultCluster {
	t.Helper()
	endpoint := etcdtest.Start(t)
	fc := &faultCluster{t: t, exe: buildEtcdCluster(t), proxy: faultproxy.New(), etcd: strings.TrimPrefix(endpoint, "http://"),
		root: t.TempDir(), certs: t.TempDir(), replicas: replicas, byAddr: map[string]*faultNode{}}
	t.Cleanup(func() { _ = fc.proxy.Close() })
	var names []string
	for i := 0; i < members; i++ {
		names = append(names, fmt.Sprintf("member%d", i))
	}
	for i := 0; i < 4; i++ {
		names = append(names, fmt.Sprintf("client%d", i))
	}
	if err := membercerts.Write(fc.certs, names...); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < members; i++ {
		n := fc.node(names[i], fmt.Sprintf("127.0.0.%d", 11+i))
		fc.members = append(fc.members, n)
		fc.startMember(n)
	}
	return fc
}

// node sets up the routes of a new process.
func (fc *faultCluster) node(name, ip string) *faultNode {
	t := fc.t
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	n := &faultNode{name: name, ip: ip, port: port}
	fc.proxy.Identify(ip, name)
	if n.addr, err = fc.proxy.Route(name, fmt.Sprintf("127.0.0.1:%d", port), ""); err != nil {
		t.Fatal(err)
	}
	if fc.replicas > 1 {
		// Replication traffic crosses the proxy too: a cut member's
		// inbound replication is cut (its own dials leave from
		// 127.0.0.1, which the proxy cannot attribute).
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n.raftPort = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if n.raftAddr, err = fc.proxy.Route(name, fmt.Sprintf("127.0.0.1:%d", n.raftPort), ""); err != nil {
			t.Fatal(err)
		}
	}
	if n.etcd, err = fc.proxy.Route("etcd", fc.etcd, name); err != nil {
		t.Fatal(err)
	}
	fc.byAddr[n.addr] = n
	return n
}

// dataDir is the member's own data: with one copy, the shared root
// (units move between members through it); replicated, a directory of
// its own (its disk).
func (fc *faultCluster) dataDir(n *faultNode) string {
	if fc.replicas > 1 {
		return filepath.Join(fc.root, n.name)
	}
	return fc.root
}

func (fc *faultCluster) args(n *faultNode, mode string) []string {
	args := []string{"-mode", mode, "-name", n.name, "-etcd", "http://" + n.etcd, "-root", fc.dataDir(n), "-ttl", etcdTTL.String(),
		"-certs", fc.certs, "-port", strconv.Itoa(n.port), "-advertise", n.addr, "-src", n.ip}
	if os.Getenv("SYNCMESH_MEMBER_LOG") != "" {
		// The members' debug logs on their stderr, kept when a run fails
		// (keepStderr).
		args = append(args, "-v")
	}
	if fc.replicas > 1 {
		args = append(args, "-replicas", strconv.Itoa(fc.replicas),
			"-raft-listen", fmt.Sprintf("127.0.0.1:%d", n.raftPort), "-raft-advertise", n.raftAddr)
		// Raft's timers: the engine's defaults (the take-over times
		// printed are those operators get), SYNCMESH_RAFT_ELECTION to
		// change them.
		if d := os.Getenv("SYNCMESH_RAFT_ELECTION"); d != "" {
			args = append(args, "-raft-election", d)
		}
	}
	return args
}

func (fc *faultCluster) startMember(n *faultNode) {
	fc.t.Helper()
	n.c = startChild(fc.t, fc.exe, n.name, fc.args(n, "member")...)
	c := n.c
	fc.t.Cleanup(func() { fc.keepStderr(n.name, c) })
	ev := n.c.wait(fc.t, "joined", 60*time.Second)
	if ev.Member != n.addr {
		fc.t.Fatalf("%s joined as %s, want its proxy address %s", n.name, ev.Member, n.addr)
	}
}

// historyClient is one recording client process.
type historyClient struct {
	n    *faultNode
	out  string
	off  int64                      // serving: how far the history was read
	last map[string]histcheck.Reply // serving: each unit's latest reply
}

// startClient starts a history client (a router-only member) with the
// given tag and extra environment, and waits until its units answered.
func (fc *faultCluster) startClient(tag string, groups, devices int, env ...string) *historyClient {
	t := fc.t
	i := fc.clients
	fc.clients++
	n := fc.node(fmt.Sprintf("client%d", i), fmt.Sprintf("127.0.0.%d", 101+i))
	// SYNCMESH_HISTORY_DIR keeps the histories (to study a failure).
	dir := os.Getenv("SYNCMESH_HISTORY_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	out := filepath.Join(dir, "history-"+tag+".jsonl")
	args := append(fc.args(n, "history"), "-tag", tag, "-client", strconv.Itoa(i), "-out", out,
		"-members", strconv.Itoa(len(fc.members)), "-routers", "1", "-groups", strconv.Itoa(groups), "-devices", strconv.Itoa(devices))
	n.c = startChildEnv(t, fc.exe, n.name, env, args...)
	n.c.wait(t, "ready", 120*time.Second)
	return &historyClient{n: n, out: out}
}

// stop ends the client's load, waits for its final reads and returns
// its history.
func (fc *faultCluster) stop(hc *historyClient) []histcheck.Op {
	t := fc.t
	if _, err := io.WriteString(hc.n.c.stdin, "stop\n"); err != nil {
		t.Fatal(err)
	}
	hc.n.c.wait(t, "report", 15*time.Minute)
	ops, err := histcheck.ReadFile(hc.out)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// serving returns, from the history so far, the units each member
// answered for last (within the last window). It reads only what was
// appended since its last call (a soak's history grows to 100 MB).
func (hc *historyClient) serving(t *testing.T, window time.Duration) map[string][]string {
	t.Helper()
	f, err := os.Open(hc.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(hc.off, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(b, '\n') + 1 // complete lines only
	hc.off += int64(end)
	if hc.last == nil {
		hc.last = map[string]histcheck.Reply{}
	}
	for _, line := range bytes.Split(b[:end], []byte("\n")) {
		var op histcheck.Op
		if len(line) == 0 || json.Unmarshal(line, &op) != nil {
			continue
		}
		for _, r := range op.Replies {
			if r.Served > hc.last[r.Target].Served {
				hc.last[r.Target] = r
			}
		}
	}
	out := map[string][]string{}
	since := time.Now().Add(-window).UnixNano()
	for u, r := range hc.last {
		if r.Served >= since {
			out[r.Member] = append(out[r.Member], u)
		}
	}
	return out
}

// busiest is the member serving the most units lately, preferring one
// not in avoid (so successive faults hit different members).
func (fc *faultCluster) busiest(hc *historyClient, avoid ...*faultNode) (*faultNode, []string) {
	if n, units := fc.busiestOf(hc, avoid); n != nil {
		return n, units
	}
	n, units := fc.busiestOf(hc, nil)
	if n == nil {
		fc.t.Fatalf("no member served anything lately; client stderr:\n%s", hc.n.c.stderrText())
	}
	return n, units
}

func (fc *faultCluster) busiestOf(hc *historyClient, avoid []*faultNode) (*faultNode, []string) {
	var best *faultNode
	var units []string
	for try := 0; try < 10 && best == nil; try++ {
		if try > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		for m, us := range hc.serving(fc.t, 5*time.Second) {
			n := fc.byAddr[m]
			if n == nil || slices.Contains(avoid, n) {
				continue
			}
			if best == nil || len(us) > len(units) {
				best, units = n, us
			}
		}
	}
	sort.Strings(units)
	return best, units
}

// kill is one SIGKILL: when, whom, and the units it served then.
type kill struct {
	at     time.Time
	member string
	units  []string
}

func (fc *faultCluster) sigkill(n *faultNode) {
	if err := n.c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		fc.t.Fatal(err)
	}
	<-n.c.exited
}

// takeoverTimes returns, for each kill, how long after it each of the
// killed member's units was first answered by another member.
func takeoverTimes(ops []histcheck.Op, kills []kill) (times []time.Duration, missing []string) {
	for _, k := range kills {
		for _, u := range k.units {
			var first int64
			for _, op := range ops {
				for _, r := range op.Replies {
					if r.Target == u && r.Member != k.member && r.Served > k.at.UnixNano() && (first == 0 || r.Served < first) {
						first = r.Served
					}
				}
			}
			if first == 0 {
				missing = append(missing, fmt.Sprintf("%s after the kill of %s at %s", u, k.member, k.at.Format("15:04:05.000")))
				continue
			}
			times = append(times, time.Duration(first-k.at.UnixNano()))
		}
	}
	return times, missing
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// TestClusterFaultsEtcd is the fault harness: three member processes over
// mutual TLS with etcd, each reachable only through a fault-injecting
// proxy on loopback (faultproxy; every process dials from its own
// loopback address, reaches etcd through its own route), and a client
// process (a router-only member) driving sends, commits, discards and
// pending reads between devices and applies and event reads on groups,
// recording every operation with its call and return time and result.
//
// Phase 1, faultRounds rounds of: the member serving the most units is
// SIGKILLed and restarted; another is SIGSTOPped past its lease and
// resumed; another is cut off from every process and etcd by the proxy
// and healed. The history must be linearizable (histcheck: porcupine
// models of a group's events and of the messages between two devices),
// lose no acknowledged operation, apply none twice, and carry no reply
// from a deposed host. The take-over times after each SIGKILL (until
// each of the killed member's units answered from another member) are
// printed: p50, p99, max.
//
// Phase 2 (a second client on units of its own): the member serving the
// most of them is SIGKILLed, its data directory deleted, and it is
// restarted empty. With one copy (SYNCMESH_REPLICAS unset or 1) the
// units' files were only there: the checker must report acknowledged
// operations lost. Replicated (SYNCMESH_REPLICAS=3: ClusterConfig.Replicas
// 3, each member its own data directory), it must report nothing.
func TestClusterFaultsEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 5 processes")
	}
	runFaults(t, faultReplicas())
}

// TestClusterFaultsReplicatedEtcd is TestClusterFaultsEtcd with every
// unit replicated on the three members (ClusterConfig.Replicas 3), each
// member with a data directory of its own: the same checks, and the
// disk-loss phase must lose nothing.
func TestClusterFaultsReplicatedEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 5 processes")
	}
	runFaults(t, 3)
}

func runFaults(t *testing.T, replicas int) {
	fc := newFaultCluster(t, 3, replicas)
	t.Logf("replicas %d, %d fault rounds", fc.replicas, faultRounds)

	// Phase 1.
	a := fc.startClient("a", 3, 6)
	time.Sleep(3 * time.Second)
	var kills []kill
	var lastKill, lastCut *faultNode
	for round := 0; round < faultRounds; round++ {
		victim, units := fc.busiest(a, lastKill, lastCut)
		lastKill = victim
		k := kill{at: time.Now(), member: victim.addr, units: units}
		fc.sigkill(victim)
		kills = append(kills, k)
		t.Logf("round %d: SIGKILL %s serving %v at %s", round, victim.name, units, k.at.UTC().Format("15:04:05.000"))
		time.Sleep(2*etcdTTL + 2*time.Second)
		fc.startMember(victim)
		time.Sleep(2 * time.Second)

		paused, units := fc.busiest(a, victim)
		if err := syscall.Kill(paused.c.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: SIGSTOP %s serving %v for %v", round, paused.name, units, 2*etcdTTL+3*time.Second)
		time.Sleep(2*etcdTTL + 3*time.Second)
		if err := syscall.Kill(paused.c.cmd.Process.Pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)

		cut, units := fc.busiest(a, victim, paused)
		lastCut = cut
		fc.proxy.Isolate(cut.name)
		t.Logf("round %d: partition: %s (serving %v) cut off from every process and etcd for %v", round, cut.name, units, 2*etcdTTL+4*time.Second)
		time.Sleep(2*etcdTTL + 4*time.Second)
		fc.proxy.Heal()
		time.Sleep(3 * time.Second)
	}
	if fc.proxy.Dropped() == 0 {
		t.Error("the partition dropped nothing: no traffic crossed the proxy")
	}
	ops := fc.stop(a)
	res := histcheck.Check(ops, checkTimeout)
	t.Logf("phase 1: %s", res)
	if !res.Clean() || len(res.Missing) > 0 {
		t.Errorf("phase 1: violations %v\nunknown (check timed out) %v\nlost %v\ntwice %v\ndeposed %v\nfinal reads failed %v", res.Explained, res.UnknownUnits, first(res.Lost), res.Twice, first(res.Deposed), res.Missing)
	}
	if len(res.Resent) > 0 {
		// Not a failure (see histcheck.Result.Resent): a late duplicate
		// send, delivered at least once, re-created an acknowledged
		// message at its sender; the recipient did not take it again.
		t.Logf("phase 1: acknowledged messages pending again at their sender (late duplicate sends): %v", first(res.Resent))
	}
	acked := 0
	for _, op := range ops {
		if op.OK && (op.Kind == histcheck.KApply || op.Kind == histcheck.KSend || op.Kind == histcheck.KFinalize) {
			acked++
		}
	}
	if acked == 0 {
		t.Fatal("phase 1: no operation acknowledged")
	}
	times, missing := takeoverTimes(ops, kills)
	slices.Sort(times)
	t.Logf("take-over after SIGKILL over %d kills, %d units: p50 %v, p99 %v, max %v", len(kills), len(times),
		percentile(times, 0.5).Round(time.Millisecond), percentile(times, 0.99).Round(time.Millisecond), percentile(times, 1).Round(time.Millisecond))
	if len(missing) > 0 {
		t.Errorf("units never answered by another member after their member's SIGKILL: %v", missing)
	}

	// Phase 2: SIGKILL, data directory deleted, restarted empty.
	b := fc.startClient("b", 3, 6)
	time.Sleep(3 * time.Second)
	victim, units := fc.busiest(b)
	fc.sigkill(victim)
	removed := fc.deleteData(victim, units)
	t.Logf("phase 2: SIGKILL %s serving %v, deleted %v, restarting it empty", victim.name, units, removed)
	fc.startMember(victim)
	time.Sleep(2*etcdTTL + 4*time.Second)
	res = histcheck.Check(fc.stop(b), checkTimeout)
	t.Logf("phase 2: %s; final reads failed: %d", res, len(res.Missing))
	if fc.replicas > 1 {
		if !res.Clean() || len(res.Missing) > 0 {
			t.Errorf("phase 2, %d replicas: a member's disk lost: violations %v\nlost %v\ntwice %v\ndeposed %v\nfinal reads failed %v",
				fc.replicas, res.Explained, first(res.Lost), res.Twice, first(res.Deposed), res.Missing)
		}
		return
	}
	// One copy: the deleted files held the only copy of those units.
	if len(res.Lost) == 0 {
		t.Errorf("phase 2, one copy: the units %v lost their only files, yet the checker reports no acknowledged operation lost: %s", units, res)
	}
	t.Logf("phase 2, one copy (expected until replication): %d acknowledged operations lost, e.g. %v", len(res.Lost), first(res.Lost))
}

// deleteData deletes the killed member's data: replicated, its own
// directory; with one copy, the files of the units it served (the
// shared root holds every unit's files: a member's disk is its units').
func (fc *faultCluster) deleteData(n *faultNode, units []string) []string {
	var dirs []string
	if fc.replicas > 1 {
		dirs = []string{fc.dataDir(n)}
	} else {
		for _, u := range units {
			kind, identity, _ := strings.Cut(u, "/")
			dirs = append(dirs, filepath.Join(fc.root, kind, hex.EncodeToString([]byte(identity))))
		}
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			fc.t.Fatal(err)
		}
	}
	return dirs
}

// first returns up to 5 entries of s.
func first(s []string) []string {
	return s[:min(len(s), 5)]
}

// TestClusterFaultsCatchPlantedBugEtcd shows the history checker catches
// planted bugs: two history clients on the same cluster, one answering
// every other group read from a stale reply (SYNCMESH_FAILPOINT=
// stale-read), one acknowledging every fifth group apply without
// applying it (ack-early). The first history must not be linearizable;
// the second must show acknowledged applies lost (and not be
// linearizable either). Without faults, so nothing else can explain them.
func TestClusterFaultsCatchPlantedBugEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 5 processes")
	}
	fc := newFaultCluster(t, 3, faultReplicas())
	stale := fc.startClient("s", 2, 2, "SYNCMESH_FAILPOINT=stale-read")
	early := fc.startClient("e", 2, 2, "SYNCMESH_FAILPOINT=ack-early")
	time.Sleep(6 * time.Second)
	rs := histcheck.Check(fc.stop(stale), time.Minute)
	re := histcheck.Check(fc.stop(early), time.Minute)
	t.Logf("stale-read: %s (not linearizable: %v)", rs, rs.Violations)
	t.Logf("ack-early: %s (lost: %v)", re, first(re.Lost))
	groupViolation := func(r histcheck.Result) bool {
		for _, v := range r.Violations {
			if !strings.Contains(v, ">") {
				return true
			}
		}
		return false
	}
	if !groupViolation(rs) {
		t.Errorf("stale reads not caught: %s", rs)
	}
	if len(re.Lost) == 0 || !groupViolation(re) {
		t.Errorf("early acknowledgements not caught: %s", re)
	}
	for _, r := range []histcheck.Result{rs, re} {
		for _, v := range r.Violations {
			if strings.Contains(v, ">") {
				t.Errorf("device messages (no bug planted there) not linearizable: %s (%v)", v, r.Explained)
			}
		}
	}
}

// keepStderr keeps, for a failed run (or any run with
// SYNCMESH_MEMBER_LOG: the debug logs break a take-over down), what a
// member process wrote on stderr: a member still running is sent
// SIGQUIT first, so Go's goroutine dump shows where it was stuck. The file is kept outside
// the test's temporary directories; its path and last lines are
// logged.
func (fc *faultCluster) keepStderr(name string, c *child) {
	t := fc.t
	if !t.Failed() && os.Getenv("SYNCMESH_MEMBER_LOG") == "" {
		return
	}
	select {
	case <-c.exited:
	default:
		_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGQUIT)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
		}
	}
	text := c.stderrText()
	dir := filepath.Join(os.TempDir(), "syncmesh-faults")
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.stderr", time.Now().UTC().Format("20060102T150405"), name, c.cmd.Process.Pid))
	if err := os.MkdirAll(dir, 0o700); err == nil {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			path = "(not kept: " + err.Error() + ")"
		}
	}
	t.Logf("%s (pid %d): stderr kept in %s; last lines:\n%s", name, c.cmd.Process.Pid, path, lastLines(text, 30))
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
