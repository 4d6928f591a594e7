package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// countingProxy forwards TCP connections to target and counts the bytes
// going each way: what the wire carries, framing and all.
type countingProxy struct {
	ln         net.Listener
	target     string
	toTarget   atomic.Uint64
	fromTarget atomic.Uint64
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      []net.Conn
	closed     atomic.Bool
}

func newCountingProxy(target string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countingProxy) Addr() string { return p.ln.Addr().String() }

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, t)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(t, c, &p.toTarget)
		go p.pipe(c, t, &p.fromTarget)
	}
}

func (p *countingProxy) pipe(dst, src net.Conn, n *atomic.Uint64) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(uint64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *countingProxy) Close() {
	p.closed.Store(true)
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func openBenchNode(ctx context.Context, name string, peers []*peer, interval time.Duration, batch int) (*runtime.Node, string, error) {
	dir, err := os.MkdirTemp("", "syncmesh-catchup-")
	if err != nil {
		return nil, "", err
	}
	n, err := runtime.Open(ctx, runtime.Config{Dir: dir, MeshID: mesh, Name: name, SyncInterval: interval, PushBatch: batch})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	if err := n.DefineTable(ctx, runtime.TableDef{Schema: "bench", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}); err != nil {
		n.Close()
		os.RemoveAll(dir)
		return nil, "", err
	}
	for _, p := range peers {
		if err := n.Trust(ctx, p.signer.Key()); err != nil {
			n.Close()
			os.RemoveAll(dir)
			return nil, "", err
		}
	}
	return n, dir, nil
}

// catchupReport measures a node joining from genesis over the protoactor
// remote transport: one peer holds events signed events; the joiner's
// catch-up rate is set beside the same run's single-node ApplySigned
// rate, and the bytes on the wire (a counting TCP proxy in front of the
// joiner) beside the signed events' size.
func catchupReport(events, sites, writers, applyBatch, pushBatch int) error {
	ctx := context.Background()
	peers, raws, err := makeEvents(events, sites)
	if err != nil {
		return err
	}
	var signed int
	for _, r := range raws {
		signed += len(r)
	}
	fmt.Printf("== sync plane: a node joining from genesis catches up on %d events from one peer over protoactor remote (gRPC, loopback, plaintext), bbolt fsync on, pushes of %d\n", events, pushBatch)
	single, err := applyRate(peers, raws, goruntimeProcs(), writers, applyBatch)
	if err != nil {
		return err
	}
	src, srcDir, err := openBenchNode(ctx, "source", peers, 20*time.Millisecond, pushBatch)
	if err != nil {
		return err
	}
	defer os.RemoveAll(srcDir)
	defer src.Close()
	for i := 0; i < len(raws); i += applyBatch {
		if _, err := src.ApplySignedBatch(ctx, raws[i:min(i+applyBatch, len(raws))]); err != nil {
			return err
		}
	}
	joiner, joinDir, err := openBenchNode(ctx, "joiner", peers, 20*time.Millisecond, pushBatch)
	if err != nil {
		return err
	}
	defer os.RemoveAll(joinDir)
	defer joiner.Close()
	port, err := freeTCPPort()
	if err != nil {
		return err
	}
	proxy, err := newCountingProxy(fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	defer proxy.Close()
	// The joiner advertises the proxy: pushes to it cross the proxy; its
	// answers go straight to the source's own address.
	remJ, err := runtime.StartRemote(joiner.System(), runtime.RemoteConfig{Port: port, AdvertisedAddress: proxy.Addr(), Plaintext: true})
	if err != nil {
		return err
	}
	defer remJ.Close()
	remJ.Serve(joiner)
	if err := joiner.AcceptPeer(src.Name()); err != nil { // only configured senders are accepted
		return err
	}
	remS, err := runtime.StartRemote(src.System(), runtime.RemoteConfig{Plaintext: true})
	if err != nil {
		return err
	}
	defer remS.Close()
	remS.Serve(src)
	remS.AddPeer("joiner", proxy.Addr())
	start := time.Now()
	if err := src.AddPeer("joiner", remS, "remote"); err != nil {
		return err
	}
	for {
		n, err := joiner.LastSeq(ctx)
		if err != nil {
			return err
		}
		if n >= uint64(events) {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return fmt.Errorf("catch-up stalled at %d of %d events", n, events)
		}
		time.Sleep(5 * time.Millisecond)
	}
	el := time.Since(start)
	rate := float64(events) / el.Seconds()
	wire := float64(proxy.toTarget.Load()) / float64(events)
	size := float64(signed) / float64(events)
	fmt.Printf("single-node ApplySignedBatch %6.0f ev/s   catch-up %6.0f ev/s in %v   catch-up/single = %.2f (target >= 0.70)\n", single, rate, el.Round(time.Millisecond), rate/single)
	fmt.Printf("wire bytes toward the joiner %.1f B/event   signed event %.1f B   wire/signed = %.3f (target <= 1.20)\n",
		wire, size, wire/size)
	return nil
}

func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
