package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// event is one line a device process prints on stdout (JSON): what it
// did, for the parent to show and to check.
type event struct {
	Kind    string        `json:"kind"` // ready, sent, pending, delivered, crashpoint, finalized, error
	ID      string        `json:"id,omitempty"`
	Seq     uint64        `json:"seq,omitempty"`
	Body    string        `json:"body,omitempty"`
	At      string        `json:"at,omitempty"`     // received_at / finalized_at
	Status  string        `json:"status,omitempty"` // COMMITTED, DISCARDED, ALREADY_...
	AckSent bool          `json:"ack_sent,omitempty"`
	Reason  string        `json:"reason,omitempty"`
	Pending []pendingSent `json:"pending,omitempty"`
	// PendingReceived is, on ready, how many received messages wait in
	// the store for the application's commit or discard.
	PendingReceived int    `json:"pending_received,omitempty"`
	Err             string `json:"err,omitempty"`
}

// pendingSent is one entry of the sender's pending list.
type pendingSent struct {
	ID       string `json:"id"`
	Seq      uint64 `json:"seq"`
	Attempts int    `json:"attempts"`
	Body     string `json:"body"`
}

// command is one line the parent writes to a device's stdin.
type command struct {
	Op   string `json:"op"` // send, pending
	Body string `json:"body,omitempty"`
}

type emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *emitter) emit(ev event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
}

func addr(user string) runtime.DeviceAddress { return runtime.DeviceAddress{User: user, Device: 1} }

func idString(id runtime.MessageID) string { return hex.EncodeToString(id[:]) }

func statusName(s runtime.CommitResult) string {
	switch s.Status {
	case runtime.Committed:
		return "COMMITTED"
	case runtime.Discarded:
		return "DISCARDED"
	case runtime.AlreadyCommitted:
		return "ALREADY_COMMITTED"
	case runtime.AlreadyDiscarded:
		return "ALREADY_DISCARDED"
	}
	return fmt.Sprint(s.Status)
}

// runDevice is one device process: alice sends what the parent tells her
// and reports her pending sent messages; bob applies what he receives
// (commits it, or discards a "spam:" body) — or, with crash, stops dead
// at his first delivery, after the receive transaction and before any
// commit, and waits for the parent's SIGKILL.
func runDevice(o options) error {
	ctx := context.Background()
	cf, err := readChat(o.dir)
	if err != nil {
		return err
	}
	self, ok := cf.Devices[o.child]
	if !ok {
		return fmt.Errorf("%s is not in chat.json", o.child)
	}
	rc := runtime.RemoteConfig{Host: "127.0.0.1", Plaintext: cf.Plaintext}
	if _, err := fmt.Sscanf(self, "127.0.0.1:%d", &rc.Port); err != nil {
		return fmt.Errorf("address %q: %w", self, err)
	}
	if !cf.Plaintext {
		if rc.TLS, rc.ClientTLS, err = meshtls.LoadNodeTLS(filepath.Join(o.dir, "tls"), o.child); err != nil {
			return err
		}
	}
	dc := &runtime.DeviceConfig{Address: addr(o.child), Buffer: 16}
	if o.child == "alice" {
		// The sender resends each pending message until its ACK arrives
		// (a fresh encryption every time): bob may be down for a while.
		dc.Retry = runtime.RetryPolicy{Interval: 500 * time.Millisecond, Backoff: 1.5, MaxInterval: 2 * time.Second}
	}
	// Messages() rather than a Handler: Open hands over the messages still
	// pending from before a crash, and they wait in the channel until this
	// process has told its remote where the peer is (the commit's ACK goes
	// there).
	n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(o.dir, o.child), MeshID: meshID, Name: o.child, Remote: &rc, Device: dc})
	if err != nil {
		return err
	}
	defer n.Close()
	for name, a := range cf.Devices {
		if name != o.child {
			// The peer hosting the device: its envelopes are accepted
			// only over a connection with its certificate.
			if err := n.Remote().AddPeer(name, a); err != nil {
				return err
			}
			if err := n.Remote().AddDevice(n, addr(name), a); err != nil {
				return err
			}
		}
	}
	out := &emitter{enc: json.NewEncoder(os.Stdout)}
	stop := make(chan struct{})
	cmds := make(chan command)
	go func() { // commands on stdin; EOF asks us to close and exit
		defer close(stop)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var c command
			if json.Unmarshal(sc.Bytes(), &c) == nil {
				cmds <- c
			}
		}
	}()
	// Counted before the application reads its first delivery: after a
	// crash, what the store kept for it.
	waiting, err := n.PendingReceivedMessageCount(ctx, nil)
	if err != nil {
		return err
	}
	go receive(ctx, n, out, o.crash)
	out.emit(event{Kind: "ready", PendingReceived: waiting})
	for {
		select {
		case <-stop:
			return nil
		case c := <-cmds:
			switch c.Op {
			case "send":
				sm, err := n.Send(ctx, addr(peerOf(o.child)), []byte(c.Body))
				switch {
				case err != nil && sm.Sequence == 0:
					out.emit(event{Kind: "error", Err: err.Error()})
				case err != nil:
					// Stored as pending but not handed over: the retry
					// schedule resends it.
					out.emit(event{Kind: "sent", ID: idString(sm.ID), Seq: sm.Sequence, Body: c.Body, Err: err.Error()})
				default:
					out.emit(event{Kind: "sent", ID: idString(sm.ID), Seq: sm.Sequence, Body: c.Body})
				}
			case "pending":
				ev := event{Kind: "pending", Pending: []pendingSent{}}
				for m, err := range n.PendingSent(ctx, 0, nil) {
					if err != nil {
						ev = event{Kind: "error", Err: err.Error()}
						break
					}
					ev.Pending = append(ev.Pending, pendingSent{ID: idString(m.ID), Seq: m.Sequence, Attempts: m.Attempts, Body: string(m.Body)})
				}
				out.emit(ev)
			}
		}
	}
}

func peerOf(name string) string {
	if name == "alice" {
		return "bob"
	}
	return "alice"
}

// receive is the application: every delivery (new, redelivered after a
// restart, or a sender's retry of a message still pending) is applied
// idempotently by its (sender, id), then committed — or discarded when
// the application can never apply it.
func receive(ctx context.Context, n *runtime.Node, out *emitter, crash bool) {
	for m := range n.Messages() {
		out.emit(event{Kind: "delivered", ID: idString(m.ID), Seq: m.Sequence, Body: string(m.Plaintext), At: m.ReceivedAt.UTC().Format(time.RFC3339Nano)})
		if crash {
			// The crash window "after Delivery, before the application's
			// commit": the message is pending in the store; the process
			// dies here (the parent sends SIGKILL), nothing is closed.
			out.emit(event{Kind: "crashpoint", ID: idString(m.ID), Seq: m.Sequence})
			select {}
		}
		var res runtime.CommitResult
		var err error
		reason := ""
		if strings.HasPrefix(string(m.Plaintext), "spam:") {
			reason = "rejected by policy"
			res, err = n.DiscardMessage(ctx, m, runtime.DiscardRejectedByPolicy)
		} else {
			res, err = n.CommitMessage(ctx, m)
		}
		if err != nil {
			out.emit(event{Kind: "error", ID: idString(m.ID), Err: err.Error()})
			continue
		}
		ev := event{Kind: "finalized", ID: idString(m.ID), Seq: m.Sequence, Status: statusName(res), AckSent: res.AckSent, Reason: reason}
		if p, ok, err := n.ProcessedMessage(ctx, m.Sender, m.ID); err == nil && ok {
			ev.At = time.UnixMilli(p.FinalizedAt).UTC().Format(time.RFC3339Nano)
		}
		out.emit(ev)
	}
}
