// Command clusterdemo runs the member-loss scenario (internal/scenario) on
// a 3-member protoactor-go cluster in this process: the test provider
// with one shared in-memory agent, disthash placement, a shared data root.
// It prints the report as JSON on stdout and exits 0 when every guarantee
// held, 1 otherwise.
//
// With -frames it runs instead the frame check (frames.go): requests
// and replies of several MiB cross between members, and one past MaxFrame
// is refused at once.
//
// It is a separate program because several protoactor remotes in one
// process trip -race inside protoactor's remote (docs/architecture.md): the hosting
// package's test builds it without -race and runs it (TestClusterMemberLoss).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"

	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/membercerts"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

func main() {
	root := flag.String("root", "", "shared data root (default: a new temporary directory, removed at exit)")
	members := flag.Int("members", 3, "cluster members")
	timeout := flag.Duration("timeout", 3*time.Minute, "overall deadline")
	verbose := flag.Bool("v", false, "log protoactor and hosting at debug level on stderr")
	idle := flag.Duration("idle", 0, "passivate grains idle this long (0: never)")
	frames := flag.Bool("frames", false, "run the frame check instead of the member-loss scenario")
	flag.Parse()
	if err := run(*root, *members, *timeout, *idle, *verbose, *frames); err != nil {
		fmt.Fprintln(os.Stderr, "clusterdemo: FAIL:", err)
		os.Exit(1)
	}
}

func run(root string, n int, timeout, idle time.Duration, verbose, frames bool) error {
	if root == "" {
		dir, err := os.MkdirTemp("", "clusterdemo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		root = dir
	}
	logger := slog.New(slog.DiscardHandler)
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	mesh := []byte("clusterdemo-mesh")
	// Members authenticate each other with mutual TLS (the default),
	// certificates from the mesh CA tooling.
	certs, err := os.MkdirTemp("", "clusterdemo-certs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(certs)
	for i := 0; i < n; i++ {
		if err := membercerts.Write(certs, fmt.Sprintf("member%d", i)); err != nil {
			return err
		}
	}
	agent := test.NewInMemAgent()
	var ms []*hosting.Cluster
	stopped := map[int]bool{}
	defer func() {
		for i, m := range ms {
			if !stopped[i] {
				_ = m.Close()
			}
		}
	}()
	t0 := time.Now()
	for i := 0; i < n; i++ {
		server, client, err := hosting.MemberTLS(certs, fmt.Sprintf("member%d", i))
		if err != nil {
			return err
		}
		m, err := hosting.NewCluster(hosting.ClusterConfig{
			TLS:         server,
			ClientTLS:   client,
			Config:      hosting.Config{Root: root, MeshID: mesh, NoSync: true, Logger: logger},
			Name:        "syncmesh-clusterdemo",
			Provider:    test.NewTestProvider(agent),
			Lookup:      disthash.New(),
			IdleTimeout: idle,
		})
		if err != nil {
			return fmt.Errorf("member %d: %w", i, err)
		}
		ms = append(ms, m)
	}
	// Every member sees every other before units are placed.
	for deadline := time.Now().Add(10 * time.Second); ; {
		ok := true
		for _, m := range ms {
			ok = ok && len(m.Members()) == n
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topology did not settle: %v", ms[0].Members())
		}
		time.Sleep(50 * time.Millisecond)
	}
	logf("%d members up in %v: %v", n, time.Since(t0), ms[0].Members())

	if frames {
		rep, err := checkFrames(ctx, ms, mesh, logf)
		out, _ := json.MarshalIndent(struct {
			frameReport
			OK    bool
			Error string `json:",omitempty"`
		}{rep, err == nil, errString(err)}, "", "  ")
		fmt.Println(string(out))
		return err
	}

	env := scenario.Env{MeshID: mesh, Logf: logf, Stop: func(i int) error {
		stopped[i] = true
		victim := ms[i].Member()
		if err := ms[i].Close(); err != nil {
			return err
		}
		// Wait until the survivors no longer see the victim (the provider
		// deregistered it), as a client would after a failure detector.
		for deadline := time.Now().Add(10 * time.Second); ; {
			gone := true
			for j, m := range ms {
				if !stopped[j] && slices.Contains(m.Members(), victim) {
					gone = false
				}
			}
			if gone {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("survivors still see %s", victim)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}}
	for _, m := range ms {
		env.Members = append(env.Members, m)
	}
	rep, err := scenario.Run(ctx, env)
	passivated := false
	if err == nil && idle > 0 {
		// Idle grains close their nodes: soon nothing is open.
		for deadline := time.Now().Add(10*idle + 5*time.Second); ; {
			open := 0
			for i, m := range ms {
				if !stopped[i] {
					open += len(m.Hosted())
				}
			}
			if open == 0 {
				passivated = true
				break
			}
			if time.Now().After(deadline) {
				err = fmt.Errorf("%d units still open %v after the scenario with -idle %v", open, time.Since(deadline), idle)
				break
			}
			time.Sleep(idle / 2)
		}
		logf("every idle grain passivated: %v", passivated)
	}
	out, _ := json.MarshalIndent(struct {
		scenario.Report
		Passivated bool
		OK         bool
		Error      string `json:",omitempty"`
		Total      string
	}{rep, passivated, err == nil, errString(err), time.Since(t0).String()}, "", "  ")
	fmt.Println(string(out))
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
