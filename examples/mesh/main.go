// Command mesh starts N syncmesh nodes as separate processes on loopback,
// connected by the protoactor-go remote (gRPC) transport with mutual TLS,
// writes rows on each, and shows them converge: a live table of every
// node's log size, state digest and per-peer lag (from the watermarks its
// peers reported), and, with -join, a progress bar while a node joining
// late catches up from genesis.
//
//	go run ./examples/mesh -n 3 -rows 20
//	go run ./examples/mesh -n 3 -join 20000 -dir ./mesh-data -keep
//
// Each node is this same binary run with -child; the parent creates the
// node directories and identities, the CA and the node certificates, and
// a mesh.json every child reads (names, addresses, public keys).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

var meshID = []byte("syncmesh-example-mesh")

// member is one node of the mesh as every child learns it from mesh.json.
type member struct {
	Name      string `json:"name"`
	Address   string `json:"address"`
	Site      []byte `json:"site"`
	Kid       []byte `json:"kid"`
	PublicKey []byte `json:"public_key"`
}

type meshFile struct {
	Members   []member `json:"members"`
	Plaintext bool     `json:"plaintext"`
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 3, "number of nodes started at once")
	flag.IntVar(&o.port, "port", 0, "first TCP port on 127.0.0.1 (node i listens on port+i; 0: free ports)")
	flag.StringVar(&o.dir, "dir", "", "data directory: one subdirectory per node, mesh.json and tls/ (default: a temporary directory)")
	flag.BoolVar(&o.keep, "keep", false, "keep -dir when it is a temporary directory")
	flag.IntVar(&o.rows, "rows", 20, "rows each node writes")
	flag.IntVar(&o.join, "join", 0, "if > 0: node-0 also writes this many events, and a node joining after the mesh converged catches up on all of them from genesis")
	flag.BoolVar(&o.plaintext, "plaintext", false, "run gRPC without TLS (default: mutual TLS with a CA created in -dir)")
	flag.DurationVar(&o.interval, "interval", 200*time.Millisecond, "sync cycle of every node")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up after this long")
	flag.BoolVar(&o.child, "child", false, "internal: run one node (started by the parent)")
	flag.StringVar(&o.name, "name", "", "internal: the child's node name")
	flag.Parse()
	var err error
	if o.child {
		err = runChild(o)
	} else {
		err = runParent(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mesh:", err)
		os.Exit(1)
	}
}

type options struct {
	n, port, rows, join int
	dir, name           string
	keep, plaintext     bool
	child               bool
	interval, timeout   time.Duration
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// prepare creates every node's directory and identity, the certificates,
// and mesh.json.
func prepare(ctx context.Context, o options, names []string) error {
	var mf meshFile
	mf.Plaintext = o.plaintext
	tlsDir := filepath.Join(o.dir, "tls")
	if !o.plaintext {
		if err := os.MkdirAll(tlsDir, 0o700); err != nil {
			return err
		}
	}
	var ca *meshtls.CA
	if !o.plaintext {
		var err error
		if ca, err = meshtls.LoadOrCreateCA(tlsDir, "syncmesh example mesh CA"); err != nil {
			return err
		}
	}
	for i, name := range names {
		n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(o.dir, name), MeshID: meshID})
		if err != nil {
			return err
		}
		id := n.Identity()
		if err := n.Close(); err != nil {
			return err
		}
		port := o.port + i
		if o.port == 0 {
			if port, err = freePort(); err != nil {
				return err
			}
		}
		mf.Members = append(mf.Members, member{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", port), Site: id.Site[:], Kid: id.Kid, PublicKey: id.PublicKey})
		if !o.plaintext {
			// One certificate per node, to serve and to dial (mutual TLS),
			// valid for the loopback address peers dial and naming the node.
			nc, err := ca.Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
			if err != nil {
				return err
			}
			if err := nc.Save(tlsDir); err != nil {
				return err
			}
		}
	}
	b, err := json.MarshalIndent(mf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.dir, "mesh.json"), b, 0o644)
}

// child is a running node process and its latest status line.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	last  status
	seen  bool
	exit  chan error
}

func (c *child) status() (status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.seen
}

func start(o options, name string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-child", "-name", name, "-dir", o.dir, "-rows", fmt.Sprint(o.rows), "-interval", o.interval.String(), "-join", fmt.Sprint(o.join)}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var st status
			if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
				fmt.Printf("[%s] %s\n", name, sc.Text())
				continue
			}
			c.mu.Lock()
			c.last, c.seen = st, true
			c.mu.Unlock()
		}
		c.exit <- cmd.Wait()
	}()
	return c, nil
}

func runParent(o options) error {
	ctx := context.Background()
	if o.n < 2 {
		return fmt.Errorf("-n must be at least 2")
	}
	if o.dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-mesh-")
		if err != nil {
			return err
		}
		o.dir = tmp
		if !o.keep {
			defer os.RemoveAll(tmp)
		}
	}
	names := make([]string, o.n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	all := names
	if o.join > 0 {
		all = append(append([]string(nil), names...), "joiner")
	}
	if err := prepare(ctx, o, all); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	mode := "mutual TLS"
	if o.plaintext {
		mode = "plaintext gRPC"
	}
	fmt.Printf("mesh: %d nodes on 127.0.0.1 (%s), data in %s\n", o.n, mode, o.dir)
	var kids []*child
	defer func() {
		for _, c := range kids {
			_ = c.stdin.Close() // asks the child to close its node and exit
		}
		for _, c := range kids {
			select {
			case <-c.exit:
			case <-time.After(20 * time.Second):
				_ = c.cmd.Process.Kill()
			}
		}
	}()
	for _, name := range names {
		c, err := start(o, name)
		if err != nil {
			return err
		}
		kids = append(kids, c)
	}
	deadline := time.Now().Add(o.timeout)
	want := uint64(o.n*(o.rows+1) + o.join)
	if err := waitConverged(kids, want, deadline, nil); err != nil {
		return err
	}
	fmt.Println("\nconverged: every node holds the same rows (same digest), and each node's message to the next was committed and acknowledged")
	printLag(kids)
	if o.join == 0 {
		return nil
	}
	fmt.Printf("\njoiner starts from genesis and catches up on %d events:\n", want)
	j, err := start(o, "joiner")
	if err != nil {
		return err
	}
	kids = append(kids, j)
	began := time.Now()
	if err := waitConverged(kids, want, deadline, func() {
		st, _ := j.status()
		bar(st.Events, want)
	}); err != nil {
		return err
	}
	el := time.Since(began)
	bar(want, want)
	fmt.Printf("\njoiner caught up in %v (%.0f events/s); every node converged\n", el.Round(time.Millisecond), float64(want)/el.Seconds())
	printLag(kids)
	return nil
}

func bar(done, total uint64) {
	const width = 40
	if total == 0 {
		total = 1
	}
	if done > total {
		done = total
	}
	filled := int(done * width / total)
	fmt.Printf("\r  [%s%s] %3d%% %d/%d events", strings.Repeat("#", filled), strings.Repeat("-", width-filled), done*100/total, done, total)
}

// waitConverged polls the children's status until every one holds want
// events, the same digest, and nothing left to push.
func waitConverged(kids []*child, want uint64, deadline time.Time, progress func()) error {
	lastPrint := time.Time{}
	started := map[string]bool{}
	for _, c := range kids {
		started[c.name] = true
	}
	for {
		ok := true
		digest := ""
		for _, c := range kids {
			st, seen := c.status()
			if !seen || !st.Written || st.Events != want || (digest != "" && st.Digest != digest) {
				ok = false
			}
			if c.name != "joiner" && (st.Committed < 1 || st.PendingSent != 0) {
				ok = false // its message not yet committed by the next node and ACKed
			}
			digest = st.Digest
			for _, p := range st.Peers {
				if !started[p.Peer] {
					continue // the joiner, not started yet
				}
				if p.Backlog != 0 || p.Retry != 0 {
					ok = false
				}
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			printStatus(kids)
			return fmt.Errorf("not converged before the timeout")
		}
		select {
		case err := <-firstExit(kids):
			return fmt.Errorf("a node exited early: %v", err)
		default:
		}
		if progress != nil {
			progress()
		} else if time.Since(lastPrint) > time.Second {
			printStatus(kids)
			lastPrint = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func firstExit(kids []*child) chan error {
	out := make(chan error, 1)
	for _, c := range kids {
		select {
		case err := <-c.exit:
			c.exit <- err // keep it for the shutdown path
			out <- fmt.Errorf("%s: %v", c.name, err)
			return out
		default:
		}
	}
	return out
}

func printStatus(kids []*child) {
	fmt.Printf("%-8s %8s %6s  %-16s %5s %5s  %s\n", "node", "events", "rows", "digest", "recv", "unack", "backlog per peer")
	for _, c := range kids {
		st, seen := c.status()
		if !seen {
			fmt.Printf("%-8s (starting)\n", c.name)
			continue
		}
		var parts []string
		for _, p := range st.Peers {
			s := fmt.Sprintf("%s:%d", p.Peer, p.Backlog)
			if p.Err != "" {
				s += "(unreachable)"
			}
			parts = append(parts, s)
		}
		fmt.Printf("%-8s %8d %6d  %-16s %5d %5d  %s\n", c.name, st.Events, st.Rows, short(st.Digest), st.Committed, st.PendingSent, strings.Join(parts, " "))
	}
}

func printLag(kids []*child) {
	fmt.Println("per-peer lag (events still to offer; time from the watermarks each peer reported):")
	for _, c := range kids {
		st, _ := c.status()
		sort.Slice(st.Peers, func(i, j int) bool { return st.Peers[i].Peer < st.Peers[j].Peer })
		var parts []string
		for _, p := range st.Peers {
			part := fmt.Sprintf("%s behind by %d events (backlog %d, re-offers %d), %d ms", p.Peer, p.BehindEvents, p.Backlog, p.Retry, p.BehindMS)
			if p.NoWatermark > 0 {
				part += fmt.Sprintf(", no watermark yet for %d groups", p.NoWatermark)
			}
			parts = append(parts, part)
		}
		fmt.Printf("  %-8s → %s\n", c.name, strings.Join(parts, "; "))
	}
}

func short(s string) string {
	if len(s) > 16 {
		return s[:16]
	}
	return s
}
