package hosting_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdtest"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/membercerts"
)

// etcdTTL is the lease TTL of the crash test's members (etcd's minimum
// with its default timing).
const etcdTTL = 2 * time.Second

// childEvent mirrors internal/etcdcluster's stdout lines.
type childEvent struct {
	Ev     string            `json:"ev"`
	Member string            `json:"member"`
	ID     string            `json:"id"`
	Reason string            `json:"reason"`
	Where  map[string]string `json:"where"`
	Report *struct {
		EventsAcked, Committed int
		Lost, Errors           []string
	} `json:"report"`
	Tenant *tenantReport `json:"tenant"`
	At     int64         `json:"at"`
}

// record mirrors internal/etcdcluster's reply records.
type record struct {
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

// child is one process of the crash test.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan childEvent
	exited chan struct{}
	stderr bytes.Buffer
	errw   *syncWriter // writes stderr

	mu  sync.Mutex
	all []childEvent
}

func startChild(t *testing.T, exe, name string, args ...string) *child {
	t.Helper()
	return startChildEnv(t, exe, name, nil, args...)
}

// startChildEnv is startChild with env added to the child's environment.
func startChildEnv(t *testing.T, exe, name string, env []string, args ...string) *child {
	t.Helper()
	c := &child{name: name, events: make(chan childEvent, 64), exited: make(chan struct{})}
	c.cmd = exec.Command(exe, args...)
	if env != nil {
		c.cmd.Env = append(os.Environ(), env...)
	}
	c.errw = &syncWriter{w: &c.stderr}
	c.cmd.Stderr = c.errw
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev childEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				c.mu.Lock()
				c.all = append(c.all, ev)
				c.mu.Unlock()
				c.events <- ev
			}
		}
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = syscall.Kill(c.cmd.Process.Pid, syscall.SIGCONT)
		<-c.exited
	})
	return c
}

// wait returns the next event named ev (skipping others).
func (c *child) wait(t *testing.T, ev string, d time.Duration) childEvent {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case e := <-c.events:
			if e.Ev == ev {
				return e
			}
		case <-c.exited:
			t.Fatalf("%s exited waiting for %q; stderr:\n%s", c.name, ev, c.stderr.String())
		case <-timer.C:
			t.Fatalf("%s: no %q in %v; stderr:\n%s", c.name, ev, d, c.stderr.String())
		}
	}
}

// stderrText is what the child wrote on stderr so far.
func (c *child) stderrText() string {
	c.errw.mu.Lock()
	defer c.errw.mu.Unlock()
	return c.stderr.String()
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func readRecords(t *testing.T, path string) []record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []record
	for _, line := range bytes.Split(b, []byte("\n")) {
		var r record
		if len(line) > 0 && json.Unmarshal(line, &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// TestClusterCrashEtcd runs hosting members in separate processes on a
// real etcd (started here on loopback), with a router-only driver member
// running load on every unit (signed events applied on groups, messages
// sent and committed between devices, each retried until acknowledged),
// and checks what hosting promises:
//
//	(a) one member is SIGKILLed: each of its units answers from a survivor
//	    within 15 s (the take-over times are logged);
//	(b) another is SIGSTOPped for 8 s (longer than its 2 s lease) and
//	    resumed: it fences itself (closes its units, rejoins under a new
//	    member id) and never serves again under its old id after its lease
//	    could have expired; a member that joins after the pause (a second
//	    driver) never reaches the old incarnation;
//	in both: from the replies (member id, unit, activation epoch,
//	activation and serve times) no two activations of a unit overlap and
//	each epoch belongs to one incarnation; and at the end every
//	acknowledged event and every committed message is still there.
//
// Wall time ≈ 1 min (plus building the child without -race: several
// protoactor remotes in one process trip -race inside protoactor).
func TestClusterCrashEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 5 processes")
	}
	endpoint := etcdtest.Start(t)
	exe := buildEtcdCluster(t)
	root, tmp, certs := t.TempDir(), t.TempDir(), t.TempDir()
	// Mutual TLS between every process (the default): one certificate
	// each, from the mesh CA tooling.
	if err := membercerts.Write(certs, "member0", "member1", "member2", "member3", "driverA", "driverB"); err != nil {
		t.Fatal(err)
	}
	common := []string{"-etcd", endpoint, "-root", root, "-ttl", etcdTTL.String(), "-certs", certs}
	byAddr := map[string]*child{}
	idOf := map[string]string{}
	startMember := func(name string) *child {
		c := startChild(t, exe, name, append([]string{"-mode", "member", "-name", name}, common...)...)
		ev := c.wait(t, "joined", 30*time.Second)
		byAddr[ev.Member], idOf[ev.Member] = c, ev.ID
		t.Logf("%s joined as %s (id %s)", name, ev.Member, ev.ID)
		return c
	}
	var members []*child
	for i := 0; i < 3; i++ {
		members = append(members, startMember(fmt.Sprintf("member%d", i)))
	}
	recsA := filepath.Join(tmp, "a.jsonl")
	drvA := startChild(t, exe, "driverA", append([]string{"-mode", "driver", "-name", "driverA", "-tag", "a", "-members", "3", "-out", recsA}, common...)...)
	ready := drvA.wait(t, "ready", 90*time.Second)
	perMember := map[string][]string{}
	for u, m := range ready.Where {
		perMember[m] = append(perMember[m], u)
	}
	t.Logf("units per member: %v", perMember)
	if len(perMember) != 3 {
		t.Fatalf("units on %d members, want 3: %v", len(perMember), perMember)
	}
	time.Sleep(2 * time.Second) // load running

	// (a) SIGKILL the member hosting the most units.
	var victim string
	for m, us := range perMember {
		if victim == "" || len(us) > len(perMember[victim]) {
			victim = m
		}
	}
	killAt := time.Now()
	if err := byAddr[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("(a) SIGKILL %s hosting %v", victim, perMember[victim])
	time.Sleep(6 * time.Second)
	members = append(members, startMember("member3")) // back to 3 hosting members
	time.Sleep(3 * time.Second)

	// (b) SIGSTOP a member serving units now, for 8 s.
	// The member serving most units lately; on a loaded machine the
	// driver's records may trail, so look again for a while.
	var paused string
	var pausedUnits []string
	for try := 0; try < 20 && paused == ""; try++ {
		if try > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		recent := map[string]map[string]bool{}
		for _, r := range readRecords(t, recsA) {
			if r.ServedAt > time.Now().Add(-5*time.Second).UnixNano() && r.Member != victim {
				if recent[r.Member] == nil {
					recent[r.Member] = map[string]bool{}
				}
				recent[r.Member][r.Unit] = true
			}
		}
		for m, us := range recent {
			if paused == "" || len(us) > len(recent[paused]) {
				paused = m
			}
		}
		pausedUnits = pausedUnits[:0]
		for u := range recent[paused] {
			pausedUnits = append(pausedUnits, u)
		}
	}
	if paused == "" {
		t.Fatalf("no surviving member served anything in 15 s; driver stderr:\n%s", drvA.stderr.String())
	}
	pausedID := idOf[paused]
	pc := byAddr[paused]
	stopAt := time.Now()
	if err := syscall.Kill(pc.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("(b) SIGSTOP %s (id %s) serving %d units", paused, pausedID, len(pausedUnits))
	time.Sleep(8 * time.Second)
	contAt := time.Now()
	if err := syscall.Kill(pc.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fenced := pc.wait(t, "fenced", 15*time.Second)
	rejoined := pc.wait(t, "joined", 30*time.Second)
	t.Logf("(b) resumed member fenced itself %v after SIGCONT (%s), rejoined as %s (id %s) %v after SIGCONT",
		time.Unix(0, fenced.At).Sub(contAt).Round(time.Millisecond), fenced.Reason, rejoined.Member, rejoined.ID, time.Unix(0, rejoined.At).Sub(contAt).Round(time.Millisecond))
	if fenced.ID != pausedID || rejoined.ID == pausedID {
		t.Fatalf("fenced %s and rejoined as %s; want fenced %s and a new id", fenced.ID, rejoined.ID, pausedID)
	}

	// A member joining after the pause: a second driver.
	recsB := filepath.Join(tmp, "b.jsonl")
	drvB := startChild(t, exe, "driverB", append([]string{"-mode", "driver", "-name", "driverB", "-tag", "b", "-members", "3", "-routers", "2", "-out", recsB}, common...)...)
	drvB.wait(t, "ready", 90*time.Second)
	time.Sleep(4 * time.Second)
	for _, d := range []*child{drvB, drvA} {
		if _, err := io.WriteString(d.stdin, "stop\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []*child{drvA, drvB} {
		rep := d.wait(t, "report", 90*time.Second).Report
		if rep == nil || len(rep.Lost) > 0 || len(rep.Errors) > 0 || rep.EventsAcked == 0 || rep.Committed == 0 {
			t.Fatalf("%s report: %+v", d.name, rep)
		}
		t.Logf("%s: %d acknowledged events and %d committed messages all there", d.name, rep.EventsAcked, rep.Committed)
	}
	for _, m := range members {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
	}

	a, b := readRecords(t, recsA), readRecords(t, recsB)
	all := append(slices.Clone(a), b...)
	checkActivations(t, all)

	// (a) take-over: the first reply from a survivor for each of the
	// killed member's units.
	takeover := takeovers(all, perMember[victim], victim, killAt)
	t.Logf("(a) take-over after SIGKILL per unit: %v", takeover)
	for u, d := range takeover {
		if d > 15*time.Second {
			t.Errorf("(a) %s served by a survivor %v after the kill, want ≤ 15 s", u, d)
		}
	}
	if len(takeover) != len(perMember[victim]) {
		t.Errorf("(a) %d of %d units of the killed member answered from a survivor", len(takeover), len(perMember[victim]))
	}
	// (b) the paused member's old incarnation serves nothing after its
	// lease could have expired; the late member never reaches it.
	for _, r := range all {
		if r.MemberID == pausedID && r.ServedAt > stopAt.Add(etcdTTL).UnixNano() {
			t.Errorf("(b) %s served %s on %s by the paused incarnation %v after SIGSTOP", r.Driver, r.Op, r.Unit, time.Unix(0, r.ServedAt).Sub(stopAt))
		}
	}
	for _, r := range b {
		if r.MemberID == pausedID {
			t.Errorf("(b) the late member was answered by the paused member's old incarnation: %+v", r)
		}
	}
	t.Logf("(b) take-over after SIGSTOP per unit (the paused member holds its files until it resumes %v later): %v", contAt.Sub(stopAt).Round(time.Millisecond), takeovers(all, pausedUnits, paused, stopAt))
}

// buildEtcdCluster builds internal/etcdcluster (without -race).
func buildEtcdCluster(t *testing.T) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "etcdcluster")
	goBin := goTool()
	if out, err := exec.Command(goBin, "build", "-o", exe, "github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdcluster").CombinedOutput(); err != nil {
		t.Fatalf("build etcdcluster: %v\n%s", err, out)
	}
	return exe
}

// checkActivations checks, from the replies alone, that every activation
// epoch of a unit belongs to one incarnation with one activation time,
// that epochs increase with activation time, and that every reply of an
// activation was served before the next activation began.
func checkActivations(t *testing.T, recs []record) {
	t.Helper()
	type act struct {
		ids              map[string]bool
		activated        int64
		first, lastServe int64
		n                int
	}
	units := map[string]map[uint64]*act{}
	for _, r := range recs {
		if r.Epoch == 0 || r.MemberID == "" || r.Member == "" {
			t.Fatalf("reply without an activation epoch: %+v", r)
		}
		if units[r.Unit] == nil {
			units[r.Unit] = map[uint64]*act{}
		}
		a := units[r.Unit][r.Epoch]
		if a == nil {
			a = &act{ids: map[string]bool{}, activated: r.ActivatedAt, first: r.ServedAt}
			units[r.Unit][r.Epoch] = a
		}
		a.ids[r.MemberID] = true
		a.n++
		a.first, a.lastServe = min(a.first, r.ServedAt), max(a.lastServe, r.ServedAt)
		if r.ActivatedAt != a.activated || r.ServedAt < r.ActivatedAt {
			t.Errorf("%s epoch %d: activated at %d and %d, served at %d", r.Unit, r.Epoch, a.activated, r.ActivatedAt, r.ServedAt)
		}
	}
	moved := 0
	for u, acts := range units {
		epochs := make([]uint64, 0, len(acts))
		for e, a := range acts {
			epochs = append(epochs, e)
			if len(a.ids) != 1 {
				t.Errorf("%s epoch %d answered by %d incarnations: %v", u, e, len(a.ids), a.ids)
			}
		}
		sort.Slice(epochs, func(i, j int) bool { return epochs[i] < epochs[j] })
		for i := 1; i < len(epochs); i++ {
			prev, next := acts[epochs[i-1]], acts[epochs[i]]
			if next.activated <= prev.lastServe {
				t.Errorf("%s: epoch %d (activated %s) began before epoch %d's last reply (%s): overlapping activations",
					u, epochs[i], stamp(next.activated), epochs[i-1], stamp(prev.lastServe))
			}
		}
		moved += len(epochs) - 1
	}
	t.Logf("%d replies over %d units, %d activation changes, no overlap", len(recs), len(units), moved)
}

func stamp(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000000") }

// takeovers returns, for each unit, how long after at the first reply
// served by a member other than from came.
func takeovers(recs []record, units []string, from string, at time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, r := range recs {
		if !slices.Contains(units, r.Unit) || r.Member == from || r.ServedAt <= at.UnixNano() {
			continue
		}
		d := time.Unix(0, r.ServedAt).Sub(at)
		if old, ok := out[r.Unit]; !ok || d < old {
			out[r.Unit] = d
		}
	}
	for u, d := range out {
		out[u] = d.Round(time.Millisecond)
	}
	return out
}
