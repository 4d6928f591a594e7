// Command soak runs syncmesh nodes as separate processes on loopback,
// over the remote (gRPC) transport with mutual TLS, under sustained load,
// and checks at the end what the runtime promises about data and
// delivery. Two scenarios:
//
//	go run ./examples/soak -scenario hostile -duration 2m
//	go run ./examples/soak -scenario faults -duration 30m -window 5m
//
// hostile: three honest nodes write rows while a fourth process, holding
// a valid certificate and a trusted key, runs one attack after another
// on them (reconciliation bounds above the clock, refetching known keys,
// random fingerprints, garbage keys and events under the wrong key as a
// responder, non-canonical keys, lease abuse, a notice flood). A control
// run with the fourth process behaving honestly comes first, with the
// same load. It prints the honest write latency and the lag of other
// nodes' rows in both runs and their ratios, and fails unless the honest
// nodes end with equal digests and event sets holding every
// acknowledged write.
//
// faults: five nodes write rows (20 shared-key writes/s each by default)
// and send each other device messages (receivers commit 90 % and discard
// 10 % after their own fsynced log) while the parent SIGKILLs and
// restarts nodes, SIGSTOPs them, restarts one with its wall clock set
// back, and restores one from a copy of its directory. At the end it
// fails unless 0 acknowledged writes are missing, rows and event sets are
// identical everywhere, every message was finalized exactly once and none
// was handed to the application after it was finalized; it prints
// send → handler latency per window, pending messages per node, RSS and
// database size over time.
//
// Each node is this same binary run with -child; the parent creates the
// node directories and identities, the CA and the node certificates, and
// a mesh.json every child reads.
package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

var meshID = []byte("syncmesh-soak-mesh")

// member is one node of the mesh as every child learns it from mesh.json.
type member struct {
	Name      string `json:"name"`
	Address   string `json:"address"`
	Site      []byte `json:"site"`
	Kid       []byte `json:"kid"`
	PublicKey []byte `json:"public_key"`
}

type meshFile struct {
	Members []member `json:"members"`
	// Extra are further trusted keys (the hostile process's second key,
	// which it signs hand-made events with).
	Extra []member `json:"extra,omitempty"`
}

type options struct {
	scenario string
	dir      string
	keep     bool
	duration time.Duration
	window   time.Duration
	settle   time.Duration
	wps, mps float64
	keys     int
	kills    int
	stops    int
	stopFor  time.Duration
	setback  time.Duration
	phase    time.Duration

	// child
	child      string
	name       string
	offset     time.Duration
	restored   bool
	noWrite    bool
	noSend     bool
	exclude    string
	attack     bool
	interval   time.Duration
	reconcile  time.Duration
	messaging  bool
	slowNotice time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.scenario, "scenario", "faults", "hostile or faults")
	flag.StringVar(&o.dir, "dir", "", "data directory (default: a temporary directory, removed at the end unless -keep)")
	flag.BoolVar(&o.keep, "keep", false, "keep -dir when it is a temporary directory")
	flag.DurationVar(&o.duration, "duration", time.Minute, "how long the load runs (per run for hostile: control and attack)")
	flag.DurationVar(&o.window, "window", 5*time.Minute, "faults: the latency window")
	flag.DurationVar(&o.settle, "settle", 5*time.Minute, "how long the nodes may take to converge after the load stops")
	flag.Float64Var(&o.wps, "wps", 20, "writes per second per node")
	flag.Float64Var(&o.mps, "mps", 10, "faults: messages per second per node")
	flag.IntVar(&o.keys, "keys", 200, "shared keys the writes go to")
	flag.IntVar(&o.kills, "kills", 17, "faults: SIGKILLs (each followed by a restart)")
	flag.IntVar(&o.stops, "stops", 2, "faults: SIGSTOPs")
	flag.DurationVar(&o.stopFor, "stop-for", 20*time.Second, "faults: how long a SIGSTOPped node stays stopped")
	flag.DurationVar(&o.setback, "setback", 2*time.Minute, "faults: how far back one node's wall clock is set at a restart")
	flag.DurationVar(&o.phase, "phase", 20*time.Second, "hostile: how long each attack runs")
	flag.DurationVar(&o.interval, "interval", 200*time.Millisecond, "sync cycle of every node")
	flag.DurationVar(&o.reconcile, "reconcile", 3*time.Second, "reconciliation interval of every node")

	flag.StringVar(&o.child, "child", "", "internal: run one node (node or hostile), started by the parent")
	flag.StringVar(&o.name, "name", "", "internal: the child's node name")
	flag.DurationVar(&o.offset, "offset", 0, "internal: the child's wall-clock offset")
	flag.BoolVar(&o.restored, "restored", false, "internal: the child's directory was restored from a copy")
	flag.BoolVar(&o.noWrite, "nowrite", false, "internal: start with writes paused")
	flag.BoolVar(&o.noSend, "nosend", false, "internal: start with sends paused")
	flag.StringVar(&o.exclude, "exclude", "", "internal: nodes not to send messages to (comma-separated)")
	flag.BoolVar(&o.attack, "attack", false, "internal: the hostile child attacks (else it behaves honestly)")
	flag.BoolVar(&o.messaging, "messaging", false, "internal: the child sends and receives device messages")
	flag.DurationVar(&o.slowNotice, "slow-notice", 0, "internal: the child's notice callback takes this long per notice")
	flag.Parse()

	var err error
	switch {
	case o.child == "node":
		err = runNode(o)
	case o.child == "hostile":
		err = runHostile(o)
	case o.child != "":
		err = fmt.Errorf("unknown -child %q", o.child)
	case o.scenario == "hostile":
		err = withDir(o, runHostileScenario)
	case o.scenario == "faults":
		err = withDir(o, runFaultsScenario)
	default:
		err = fmt.Errorf("unknown -scenario %q", o.scenario)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func withDir(o options, run func(options) error) error {
	if o.dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-soak-")
		if err != nil {
			return err
		}
		o.dir = tmp
		if !o.keep {
			defer os.RemoveAll(tmp)
		}
	}
	return run(o)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// prepare creates every node's directory and identity, the CA and the
// node certificates, a second trusted key for extra (written to
// <dir>/<extra>.signkey), and mesh.json.
func prepare(ctx context.Context, dir string, names []string, extra string) error {
	var mf meshFile
	tlsDir := filepath.Join(dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		return err
	}
	ca, err := meshtls.LoadOrCreateCA(tlsDir, "syncmesh soak CA")
	if err != nil {
		return err
	}
	for _, name := range names {
		n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(dir, name), MeshID: meshID})
		if err != nil {
			return err
		}
		id := n.Identity()
		if err := n.Close(); err != nil {
			return err
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		mf.Members = append(mf.Members, member{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", port), Site: id.Site[:], Kid: id.Kid, PublicKey: id.PublicKey})
		nc, err := ca.Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
		if err != nil {
			return err
		}
		if err := nc.Save(tlsDir); err != nil {
			return err
		}
	}
	if extra != "" {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		var site messages.SiteID
		if _, err := rand.Read(site[:]); err != nil {
			return err
		}
		kid := sign.KidFor(pub)
		mf.Extra = append(mf.Extra, member{Name: extra + "-signer", Site: site[:], Kid: kid, PublicKey: pub})
		if err := os.WriteFile(filepath.Join(dir, extra+".signkey"), append(site[:], priv...), 0o600); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(mf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "mesh.json"), b, 0o644)
}

func readMesh(dir string) (meshFile, error) {
	var mf meshFile
	b, err := os.ReadFile(filepath.Join(dir, "mesh.json"))
	if err != nil {
		return mf, err
	}
	return mf, json.Unmarshal(b, &mf)
}

// proc is a running child process, restartable, and its latest status.
type proc struct {
	name  string
	kind  string // node or hostile
	o     options
	extra []string // flags of the next start

	mu      sync.Mutex
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	last    status
	seen    bool
	final   *status
	exit    chan error
	stopped bool // SIGSTOPped
	peak    status
	killing bool // killed or restarted by the parent: its exit is expected
}

// start starts the child with its current flags.
func (p *proc) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"-child", p.kind, "-name", p.name, "-dir", p.o.dir,
		"-wps", fmt.Sprint(p.o.wps), "-mps", fmt.Sprint(p.o.mps), "-keys", fmt.Sprint(p.o.keys),
		"-interval", p.o.interval.String(), "-reconcile", p.o.reconcile.String(), "-phase", p.o.phase.String()}
	args = append(args, p.extra...)
	cmd := exec.Command(self, args...)
	stderr, err := os.OpenFile(filepath.Join(p.o.dir, p.name+".stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan error, 1)
	p.mu.Lock()
	p.cmd, p.stdin, p.exit, p.seen, p.stopped = cmd, stdin, exit, false, false
	p.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var st status
			if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
				fmt.Printf("[%s] %s\n", p.name, sc.Text())
				continue
			}
			p.mu.Lock()
			if st.Kind == "final" {
				p.final = &st
			} else {
				p.last, p.seen = st, true
				p.peak.PendingSent = max(p.peak.PendingSent, st.PendingSent)
				p.peak.PendingRecv = max(p.peak.PendingRecv, st.PendingRecv)
				p.peak.RSS = max(p.peak.RSS, st.RSS)
				p.peak.DB = max(p.peak.DB, st.DB)
			}
			p.mu.Unlock()
		}
		err := cmd.Wait()
		stderr.Close()
		exit <- err
	}()
	return nil
}

func (p *proc) status() (status, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.seen && !p.stopped
}

// send writes one command line to the child (ignored if it is gone).
func (p *proc) send(cmd string) {
	p.mu.Lock()
	in := p.stdin
	p.mu.Unlock()
	if in != nil {
		_, _ = io.WriteString(in, cmd+"\n")
	}
}

// kill SIGKILLs the child and waits for it to be gone.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, exit := p.cmd, p.exit
	if p.stopped {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	err := <-exit
	exit <- err
}

func (p *proc) signal(s syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(s)
	p.stopped = s == syscall.SIGSTOP
}

// stop asks the child to close its node and exit (stdin closed), then
// kills it after timeout.
func (p *proc) stop(timeout time.Duration) {
	p.mu.Lock()
	in, exit, cmd := p.stdin, p.exit, p.cmd
	p.mu.Unlock()
	if in == nil {
		return
	}
	_ = in.Close()
	select {
	case err := <-exit:
		exit <- err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
	}
}

// exited reports the child's exit error if it exited.
func (p *proc) exited() (error, bool) {
	p.mu.Lock()
	exit := p.exit
	p.mu.Unlock()
	select {
	case err := <-exit:
		exit <- err
		return err, true
	default:
		return nil, false
	}
}

// finalReport asks the child for its final report and waits for it.
func (p *proc) finalReport(timeout time.Duration) (status, error) {
	p.send("final")
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		f := p.final
		p.mu.Unlock()
		if f != nil {
			return *f, nil
		}
		if err, ok := p.exited(); ok {
			return status{}, fmt.Errorf("%s exited before its final report: %v", p.name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return status{}, fmt.Errorf("%s: no final report within %v", p.name, timeout)
}

// converged waits until every proc reports the same digest and event
// count, nothing pending either way and no backlog toward any peer.
func converged(procs []*proc, timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	for {
		ok := true
		var first status
		for i, p := range procs {
			st, seen := p.status()
			if !seen || st.PendingSent != 0 || st.PendingRecv != 0 || st.Backlog != 0 || st.Loading {
				ok = false
				break
			}
			if i == 0 {
				first = st
			} else if st.Digest != first.Digest || st.Events != first.Events {
				ok = false
				break
			}
		}
		if ok {
			return time.Since(began), nil
		}
		for _, p := range procs {
			if err, gone := p.exited(); gone {
				return 0, fmt.Errorf("%s exited: %v", p.name, err)
			}
		}
		if time.Since(began) > timeout {
			printStatus(procs)
			return 0, fmt.Errorf("not converged within %v", timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func printStatus(procs []*proc) {
	fmt.Printf("  %-9s %8s %5s %-12s %7s %6s %6s %6s %7s %8s %9s\n", "node", "events", "rows", "digest", "writes", "wfail", "psent", "precv", "backlog", "rss MiB", "db MiB")
	for _, p := range procs {
		st, seen := p.status()
		if !seen {
			fmt.Printf("  %-9s (down or stopped)\n", p.name)
			continue
		}
		fmt.Printf("  %-9s %8d %5d %-12s %7d %6d %6d %6d %7d %8.1f %9.1f\n", p.name, st.Events, st.Rows, short(st.Digest), st.Writes, st.WriteFails,
			st.PendingSent, st.PendingRecv, st.Backlog, mib(st.RSS), mib(st.DB))
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// pct returns the q-quantile (0..1) of v (nearest rank), 0 for none.
func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
