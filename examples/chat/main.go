// Command chat shows the delivery plane's commit boundary across a crash:
// two devices, alice and bob, in two processes on loopback, talking over
// the remote (gRPC) transport with mutual TLS.
//
//  1. alice sends bob a message; bob's process receives it (the ratchet
//     step and the pending row are durable) and is SIGKILLed before its
//     application commits it — not closed, killed;
//
//  2. alice's pending list still holds the message: no ACK came;
//
//  3. bob restarts: the message is delivered again, with the same
//     sequence; bob commits it, the ACK clears alice's pending entry;
//
//  4. alice sends a "spam:" message: bob discards it (rejected by
//     policy), which acknowledges it too.
//
//     go run ./examples/chat
//     go run ./examples/chat -dir ./chat-data -keep
//
// Each device is this binary run with -child; the parent creates the
// directories, the CA and the device certificates, and chat.json (the
// devices' addresses), then drives the children through stdin and reads
// what they did from their stdout.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

var meshID = []byte("syncmesh-example-chat")

type chatFile struct {
	Plaintext bool              `json:"plaintext"`
	Devices   map[string]string `json:"devices"` // user → 127.0.0.1:port
}

func readChat(dir string) (chatFile, error) {
	var cf chatFile
	b, err := os.ReadFile(filepath.Join(dir, "chat.json"))
	if err == nil {
		err = json.Unmarshal(b, &cf)
	}
	return cf, err
}

type options struct {
	dir       string
	keep      bool
	plaintext bool
	timeout   time.Duration
	child     string
	crash     bool
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", "", "data directory: alice/, bob/, tls/ and chat.json (default: a temporary directory)")
	flag.BoolVar(&o.keep, "keep", false, "keep -dir when it is a temporary directory")
	flag.BoolVar(&o.plaintext, "plaintext", false, "run gRPC without TLS (default: mutual TLS with a CA created in -dir)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up waiting for a step after this long")
	flag.StringVar(&o.child, "child", "", "internal: run the device alice or bob (started by the parent)")
	flag.BoolVar(&o.crash, "crash", false, "internal: stop dead at the first delivery, before the commit")
	flag.Parse()
	var err error
	if o.child != "" {
		err = runDevice(o)
	} else {
		err = runParent(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// prepare writes chat.json and, unless plaintext, the CA and one
// certificate per device.
func prepare(o options) error {
	cf := chatFile{Plaintext: o.plaintext, Devices: map[string]string{}}
	var ca *meshtls.CA
	tlsDir := filepath.Join(o.dir, "tls")
	if !o.plaintext {
		if err := os.MkdirAll(tlsDir, 0o700); err != nil {
			return err
		}
		var err error
		if ca, err = meshtls.LoadOrCreateCA(tlsDir, "syncmesh chat example CA"); err != nil {
			return err
		}
	}
	for _, name := range []string{"alice", "bob"} {
		port, err := freePort()
		if err != nil {
			return err
		}
		cf.Devices[name] = fmt.Sprintf("127.0.0.1:%d", port)
		if !o.plaintext {
			nc, err := ca.Issue(name, meshtls.NodeOptions{Hosts: []string{"127.0.0.1"}})
			if err != nil {
				return err
			}
			if err := nc.Save(tlsDir); err != nil {
				return err
			}
		}
	}
	b, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.dir, "chat.json"), b, 0o644)
}

// proc is a running device process.
type proc struct {
	label  string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	exit   chan error
}

func start(o options, name, label string, crash bool) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-child", name, "-dir", o.dir}
	if crash {
		args = append(args, "-crash")
	}
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
	p := &proc{label: label, cmd: cmd, stdin: stdin, events: make(chan event, 64), exit: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				fmt.Printf("[%s] %s\n", label, sc.Text())
				continue
			}
			show(label, ev)
			p.events <- ev
		}
		close(p.events)
		p.exit <- cmd.Wait()
	}()
	return p, nil
}

func (p *proc) send(c command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(p.stdin, "%s\n", b)
	return err
}

// await returns the next event of p that match accepts, skipping others.
func (p *proc) await(timeout time.Duration, what string, match func(event) bool) (event, error) {
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				return event{}, fmt.Errorf("%s exited while waiting for %s", p.label, what)
			}
			if ev.Kind == "error" {
				return event{}, fmt.Errorf("%s: %s", p.label, ev.Err)
			}
			if match(ev) {
				return ev, nil
			}
		case <-deadline:
			return event{}, fmt.Errorf("%s: no %s within %v", p.label, what, timeout)
		}
	}
}

// stop closes p's stdin (the device closes its node and exits) and waits.
func (p *proc) stop() error {
	_ = p.stdin.Close()
	for range p.events {
	}
	select {
	case err := <-p.exit:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("%s did not exit", p.label)
	}
}

func show(label string, ev event) {
	switch ev.Kind {
	case "ready":
		fmt.Printf("[%s] ready; received messages pending the application's commit: %d\n", label, ev.PendingReceived)
	case "sent":
		fmt.Printf("[%s] sent id=%s seq=%d body=%q (stored as pending before the hand-off)\n", label, ev.ID, ev.Seq, ev.Body)
	case "pending":
		fmt.Printf("[%s] pending sent messages: %d\n", label, len(ev.Pending))
		for _, m := range ev.Pending {
			fmt.Printf("[%s]   id=%s seq=%d attempts=%d body=%q\n", label, m.ID, m.Seq, m.Attempts, m.Body)
		}
	case "delivered":
		fmt.Printf("[%s] delivered id=%s seq=%d received_at=%s body=%q\n", label, ev.ID, ev.Seq, ev.At, ev.Body)
	case "crashpoint":
		fmt.Printf("[%s] stopping before the commit of id=%s seq=%d (pending in the store; waiting to be killed)\n", label, ev.ID, ev.Seq)
	case "finalized":
		extra := ""
		if ev.Reason != "" {
			extra = " reason=" + ev.Reason
		}
		fmt.Printf("[%s] %s id=%s seq=%d ack_sent=%v finalized_at=%s%s\n", label, ev.Status, ev.ID, ev.Seq, ev.AckSent, ev.At, extra)
	case "error":
		fmt.Printf("[%s] error: %s\n", label, ev.Err)
	}
}

func runParent(o options) (err error) {
	if o.dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-chat-")
		if err != nil {
			return err
		}
		o.dir = tmp
		if !o.keep {
			defer os.RemoveAll(tmp)
		}
	}
	if err := prepare(o); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	mode := "mutual TLS"
	if o.plaintext {
		mode = "plaintext gRPC (-plaintext)"
	}
	fmt.Printf("chat: alice and bob in two processes on 127.0.0.1 (%s), data in %s\n", mode, o.dir)
	var running []*proc
	defer func() {
		for _, p := range running {
			if e := p.stop(); e != nil && err == nil {
				err = e
			}
		}
	}()
	bob1, err := start(o, "bob", "bob#1", true)
	if err != nil {
		return err
	}
	killed := false
	defer func() {
		if !killed {
			_ = bob1.cmd.Process.Kill()
		}
	}()
	if _, err := bob1.await(o.timeout, "ready", func(ev event) bool { return ev.Kind == "ready" }); err != nil {
		return err
	}
	alice, err := start(o, "alice", "alice", false)
	if err != nil {
		return err
	}
	running = append(running, alice)
	if _, err := alice.await(o.timeout, "ready", func(ev event) bool { return ev.Kind == "ready" }); err != nil {
		return err
	}

	fmt.Println("\n-- 1. alice sends; bob receives and is killed before his application commits")
	if err := alice.send(command{Op: "send", Body: "hello bob"}); err != nil {
		return err
	}
	sent, err := alice.await(o.timeout, "sent", func(ev event) bool { return ev.Kind == "sent" })
	if err != nil {
		return err
	}
	first, err := bob1.await(o.timeout, "delivery", func(ev event) bool { return ev.Kind == "delivered" && ev.ID == sent.ID })
	if err != nil {
		return err
	}
	if _, err := bob1.await(o.timeout, "crash point", func(ev event) bool { return ev.Kind == "crashpoint" }); err != nil {
		return err
	}
	if err := bob1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL bob#1: %w", err)
	}
	killed = true
	for range bob1.events {
	}
	werr := <-bob1.exit
	var exitErr *exec.ExitError
	if !errors.As(werr, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		return fmt.Errorf("bob#1 did not die of SIGKILL: %v", werr)
	}
	fmt.Printf("[parent] bob#1 (pid %d) exited: %v — nothing was closed or flushed\n", bob1.cmd.Process.Pid, werr)

	fmt.Println("\n-- 2. alice still holds the message as pending: no ACK came")
	if err := alice.send(command{Op: "pending"}); err != nil {
		return err
	}
	pend, err := alice.await(o.timeout, "pending list", func(ev event) bool { return ev.Kind == "pending" })
	if err != nil {
		return err
	}
	if len(pend.Pending) != 1 || pend.Pending[0].ID != sent.ID {
		return fmt.Errorf("alice's pending list is %+v, want only %s", pend.Pending, sent.ID)
	}

	fmt.Println("\n-- 3. bob restarts: the message is delivered again with the same sequence, and committed")
	bob2, err := start(o, "bob", "bob#2", false)
	if err != nil {
		return err
	}
	running = append(running, bob2)
	ready, err := bob2.await(o.timeout, "ready", func(ev event) bool { return ev.Kind == "ready" })
	if err != nil {
		return err
	}
	if ready.PendingReceived != 1 {
		return fmt.Errorf("bob#2 found %d pending received messages in his store, want 1", ready.PendingReceived)
	}
	again, err := bob2.await(o.timeout, "redelivery", func(ev event) bool { return ev.Kind == "delivered" && ev.ID == sent.ID })
	if err != nil {
		return err
	}
	if again.Seq != first.Seq || again.At != first.At {
		return fmt.Errorf("redelivered as seq %d received_at %s, first delivered as seq %d received_at %s", again.Seq, again.At, first.Seq, first.At)
	}
	fmt.Printf("[parent] redelivered after the crash with the same sequence %d and receive time\n", again.Seq)
	if _, err := bob2.await(o.timeout, "commit", func(ev event) bool { return ev.Kind == "finalized" && ev.ID == sent.ID && ev.Status == "COMMITTED" }); err != nil {
		return err
	}
	if err := waitDrained(alice, o.timeout); err != nil {
		return err
	}

	fmt.Println("\n-- 4. alice sends spam; bob's application discards it, which acknowledges it too")
	if err := alice.send(command{Op: "send", Body: "spam: buy now"}); err != nil {
		return err
	}
	spam, err := alice.await(o.timeout, "sent", func(ev event) bool { return ev.Kind == "sent" })
	if err != nil {
		return err
	}
	if _, err := bob2.await(o.timeout, "discard", func(ev event) bool { return ev.Kind == "finalized" && ev.ID == spam.ID && ev.Status == "DISCARDED" }); err != nil {
		return err
	}
	if err := waitDrained(alice, o.timeout); err != nil {
		return err
	}
	fmt.Println("\nchat: ok — the killed receiver lost nothing, the message was redelivered with its sequence, committed once, and every ACK cleared the sender's pending list")
	return nil
}

// waitDrained asks alice for her pending list until it is empty.
func waitDrained(alice *proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := alice.send(command{Op: "pending"}); err != nil {
			return err
		}
		ev, err := alice.await(timeout, "pending list", func(ev event) bool { return ev.Kind == "pending" })
		if err != nil {
			return err
		}
		if len(ev.Pending) == 0 {
			fmt.Println("[parent] alice's pending list is empty: bob's ACK arrived")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("alice still has %d pending after %v", len(ev.Pending), timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
