package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

// status is the line a child prints every 200 ms.
type status struct {
	Node    string `json:"node"`
	Events  uint64 `json:"events"`  // local log size
	Rows    int    `json:"rows"`    // live rows of app.items
	Digest  string `json:"digest"`  // SHA-256 of the table's materialized state
	Written bool   `json:"written"` // this node finished its own writes
	// The delivery plane: messages this node received and committed, and
	// its sent messages still waiting for the receiver's ACK.
	Committed   int       `json:"committed"`
	PendingSent int       `json:"pending_sent"`
	Peers       []peerLag `json:"peers"`
	Inbound     []inbound `json:"inbound"`
}

type peerLag struct {
	Peer    string `json:"peer"`
	Backlog uint64 `json:"backlog"` // our log entries past the peer's cursor
	Retry   int    `json:"retry"`
	// BehindEvents is Backlog + Retry: how many events the peer still
	// lacks from us; BehindMS our watermark minus the peer's, worst group
	// among those it reported (NoWatermark counts the others).
	BehindEvents uint64 `json:"behind_events"`
	BehindMS     int64  `json:"behind_ms"`
	NoWatermark  int    `json:"no_watermark"`
	Err          string `json:"err,omitempty"`
}

type inbound struct {
	From    string `json:"from"`
	Through uint64 `json:"through"`
	Tail    uint64 `json:"tail"`
}

var items = runtime.TableDef{Schema: "app", Table: "items", KeyColumns: []string{"id"}, Columns: []string{"owner", "n"}}

func runChild(o options) error {
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(o.dir, "mesh.json"))
	if err != nil {
		return err
	}
	var mf meshFile
	if err := json.Unmarshal(b, &mf); err != nil {
		return err
	}
	var me *member
	for i := range mf.Members {
		if mf.Members[i].Name == o.name {
			me = &mf.Members[i]
		}
	}
	if me == nil {
		return fmt.Errorf("%s is not in mesh.json", o.name)
	}
	rc := runtime.RemoteConfig{Host: "127.0.0.1", Plaintext: mf.Plaintext}
	if _, err := fmt.Sscanf(me.Address, "127.0.0.1:%d", &rc.Port); err != nil {
		return fmt.Errorf("address %q: %w", me.Address, err)
	}
	if !mf.Plaintext {
		if rc.TLS, rc.ClientTLS, err = meshtls.LoadNodeTLS(filepath.Join(o.dir, "tls"), o.name); err != nil {
			return err
		}
	}
	// The node starts the remote transport and serves its pushes on it.
	// The node is also a device; the same remote carries its envelopes.
	self := runtime.DeviceAddress{User: o.name, Device: 1}
	// Peers' keys are in Config.Trusted: applied before the remote serves,
	// so no push is dropped for a kid not trusted yet (a joiner
	// trusting after Open drops them until a reconciliation repairs it).
	var trusted []runtime.PeerKey
	for _, m := range mf.Members {
		if m.Name != o.name {
			var site messages.SiteID
			copy(site[:], m.Site)
			trusted = append(trusted, runtime.PeerKey{Kid: m.Kid, Site: site, PublicKey: m.PublicKey})
		}
	}
	n, err := runtime.Open(ctx, runtime.Config{Dir: filepath.Join(o.dir, o.name), MeshID: meshID, Name: o.name, SyncInterval: o.interval, Remote: &rc, Trusted: trusted,
		Device: &runtime.DeviceConfig{Address: self, Buffer: 64,
			// Resend until the receiver's ACK: it may not be up yet.
			Retry: runtime.RetryPolicy{Interval: 300 * time.Millisecond, Backoff: 1.5, MaxInterval: 2 * time.Second}}})
	if err != nil {
		return err
	}
	defer n.Close()
	if err := n.DefineTable(ctx, items); err != nil {
		return err
	}
	rem := n.Remote()
	for _, m := range mf.Members {
		if m.Name == o.name {
			continue
		}
		var site messages.SiteID
		copy(site[:], m.Site)
		rem.AddPeer(m.Name, m.Address)
		if err := rem.AddDevice(n, runtime.DeviceAddress{User: m.Name, Device: 1}, m.Address); err != nil {
			return err
		}
		if err := n.AddPeer(m.Name, rem, "remote", runtime.PeerSite(site)); err != nil {
			return err
		}
	}
	// Commit every message delivered (after "applying" it: printing).
	var committed atomic.Int64
	go func() {
		for m := range n.Messages() {
			if res, err := n.CommitMessage(ctx, m); err == nil && (res.Status == runtime.Committed || res.Status == runtime.AlreadyCommitted) {
				committed.Add(1)
			}
		}
	}()
	var written sync.WaitGroup
	written.Add(1)
	done := make(chan struct{})
	go func() {
		defer written.Done()
		if err := write(ctx, n, o); err != nil {
			fmt.Fprintf(os.Stderr, "[%s] write: %v\n", o.name, err)
		}
		if to := nextNode(mf, o.name); to != "" {
			// ErrNotHandedOff (the peer is not up yet) leaves it pending:
			// the retry schedule resends it until the ACK arrives.
			if _, err := n.Send(ctx, runtime.DeviceAddress{User: to, Device: 1}, []byte("hello from "+o.name)); err != nil && !errors.Is(err, runtime.ErrNotHandedOff) {
				fmt.Fprintf(os.Stderr, "[%s] send: %v\n", o.name, err)
			}
		}
	}()
	go func() { written.Wait(); close(done) }()
	stop := make(chan struct{})
	go func() { // the parent closes our stdin to stop us
		_, _ = bufio.NewReader(os.Stdin).ReadString(0)
		close(stop)
	}()
	enc := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		st, err := report(ctx, n, o.name)
		if err != nil {
			return err
		}
		select {
		case <-done:
			st.Written = true
		default:
		}
		st.Committed = int(committed.Load())
		pending := 0
		for _, err := range n.PendingSent(ctx, 0, nil) {
			if err != nil {
				break
			}
			pending++
		}
		st.PendingSent = pending
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
}

// nextNode is the node name sends to: the next one in mesh.json among
// the nodes started at once (the joiner sends and receives nothing).
func nextNode(mf meshFile, name string) string {
	var ring []string
	for _, m := range mf.Members {
		if m.Name != "joiner" {
			ring = append(ring, m.Name)
		}
	}
	for i, m := range ring {
		if m == name {
			return ring[(i+1)%len(ring)]
		}
	}
	return ""
}

// write makes this node's own rows, a contended row every node writes,
// and, on node-0 with -join, a bulk of updates for the joiner to catch up
// on (written by several goroutines: the node group-commits them).
func write(ctx context.Context, n *runtime.Node, o options) error {
	if o.name == "joiner" {
		return nil
	}
	var idx int
	fmt.Sscanf(o.name, "node-%d", &idx)
	for k := 0; k < o.rows; k++ {
		if _, err := n.Upsert(ctx, "app", "items", map[string]any{"id": idx*1_000_000 + k}, map[string]any{"owner": o.name, "n": k}); err != nil {
			return err
		}
	}
	if _, err := n.Upsert(ctx, "app", "items", map[string]any{"id": -1}, map[string]any{"owner": o.name}); err != nil {
		return err
	}
	if idx != 0 || o.join == 0 {
		return nil
	}
	const writers = 16
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := w; k < o.join; k += writers {
				if _, err := n.Upsert(ctx, "app", "items", map[string]any{"id": 500_000_000 + k%1000}, map[string]any{"owner": o.name, "n": k}); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func report(ctx context.Context, n *runtime.Node, name string) (status, error) {
	st := status{Node: name}
	h := sha256.New()
	var err error
	for r, rerr := range n.Rows(ctx, "app", "items", runtime.ScanOptions{IncludeDeleted: true}) {
		if rerr != nil {
			err = rerr
			break
		}
		if r.Exists {
			st.Rows++
		}
		fmt.Fprintf(h, "%x %v %v %v|", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
		for _, c := range items.Columns {
			cell := r.Cells[c]
			fmt.Fprintf(h, "%s %v %x %v|", c, cell.State, []byte(cell.Value), cell.Clock)
		}
	}
	if err != nil {
		return st, err
	}
	st.Digest = hex.EncodeToString(h.Sum(nil))
	if st.Events, err = n.LastSeq(ctx); err != nil {
		return st, err
	}
	// Lag in events (what this node still has to offer the peer) and in
	// time (watermarks): a joiner with a backlog reports no watermark yet,
	// so its time lag alone would read 0.
	peers, err := n.PeerReports(ctx)
	if err != nil {
		return st, err
	}
	for _, p := range peers {
		st.Peers = append(st.Peers, peerLag{Peer: p.Peer, Backlog: p.BacklogEvents, Retry: p.RetryEvents,
			BehindEvents: p.LagEvents, BehindMS: p.LagMS, NoWatermark: p.GroupsWithoutWatermark, Err: p.LastError})
	}
	in, err := n.Inbound(ctx)
	if err != nil {
		return st, err
	}
	for _, i := range in {
		st.Inbound = append(st.Inbound, inbound{From: i.From, Through: i.Through, Tail: i.Tail})
	}
	return st, nil
}
