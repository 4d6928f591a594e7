package hosting_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

// placements returns a Local that keeps requests and replies in memory and
// one that sends each through the wire codec (what a cluster member does):
// a page limit must hold the same on both.
func placements(t *testing.T) map[string]*hosting.Local {
	t.Helper()
	plain, err := hosting.NewLocal(hosting.Config{Root: t.TempDir(), MeshID: testMesh, NoSync: true, LockTimeout: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	return map[string]*hosting.Local{"in-process": plain, "wire": newLocal(t, t.TempDir())}
}

// TestEventIDsPageAtAndPastTheDecoderBound: a group holding exactly
// MaxEventIDs events lists them in one OpEvents page, and one holding one
// more in two; Client.EventIDs returns every id, in log order, on the
// in-process Local and through the wire codec alike.
func TestEventIDsPageAtAndPastTheDecoderBound(t *testing.T) {
	ctx := testCtx(t)
	w := writer(t)
	evs, err := w.Events("big", hosting.MaxEventIDs+1)
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range placements(t) {
		t.Run(name, func(t *testing.T) {
			c := hosting.Client{P: l}
			create(t, ctx, l, hosting.KindGroup, "big")
			if err := c.Trust(ctx, "big", w.Key()); err != nil {
				t.Fatal(err)
			}
			if err := c.DefineTable(ctx, "big", scenario.Table); err != nil {
				t.Fatal(err)
			}
			outs, _, err := c.Apply(ctx, "big", evs[:hosting.MaxEventIDs])
			if err != nil {
				t.Fatal(err)
			}
			check := func(n int, pages int) {
				t.Helper()
				rep, err := l.Request(ctx, hosting.KindGroup, "big", &hosting.Request{Op: hosting.OpEvents, Principal: &testTenant})
				if err != nil {
					t.Fatalf("%d events, first page: %v", n, err)
				}
				if len(rep.IDs) != min(n, hosting.MaxEventIDs) || rep.More != (pages > 1) {
					t.Fatalf("%d events, first page: %d ids, more %v", n, len(rep.IDs), rep.More)
				}
				ids, err := c.EventIDs(ctx, "big")
				if err != nil {
					t.Fatalf("%d events: EventIDs: %v", n, err)
				}
				if len(ids) != n {
					t.Fatalf("%d events: EventIDs listed %d", n, len(ids))
				}
				for i, id := range ids {
					if id != outs[i].ID {
						t.Fatalf("%d events: id %d is %s, applied %s", n, i, id, outs[i].ID)
					}
				}
			}
			check(hosting.MaxEventIDs, 1)
			more, _, err := c.Apply(ctx, "big", evs[hosting.MaxEventIDs:])
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, more...)
			check(hosting.MaxEventIDs+1, 2)
		})
	}
}

// TestReplyListsAtTheDecoderBound: a Reply whose lists hold exactly
// messages.MaxArrayElements items (and a map of messages.MaxMapPairs)
// crosses the wire; one more is refused by the writer with
// messages.ErrTooLarge, never sent for the reader to fail on. Every page
// limit is within the bound.
func TestReplyListsAtTheDecoderBound(t *testing.T) {
	for name, limit := range map[string]int{"MaxEventIDs": hosting.MaxEventIDs, "MaxScanRows": hosting.MaxScanRows,
		"MaxPendingPage": hosting.MaxPendingPage, "MaxChanges": hosting.MaxChanges, "MaxPushEvents (apply outcomes)": messages.MaxPushEvents} {
		if limit > messages.MaxArrayElements {
			t.Errorf("%s = %d, past the decoder's %d", name, limit, messages.MaxArrayElements)
		}
	}
	if hosting.MaxPageBytes >= hosting.MaxFrame {
		t.Errorf("MaxPageBytes %d leaves no room in MaxFrame %d", hosting.MaxPageBytes, hosting.MaxFrame)
	}
	cells := func(n int) map[string]hosting.Cell {
		m := make(map[string]hosting.Cell, n)
		for i := range n {
			m[fmt.Sprintf("c%d", i)] = hosting.Cell{State: 1}
		}
		return m
	}
	for name, fill := range map[string]func(r *hosting.Reply, n int){
		"ids": func(r *hosting.Reply, n int) {
			for range n {
				r.IDs = append(r.IDs, make([]byte, 32))
			}
		},
		"rows":     func(r *hosting.Reply, n int) { r.Rows = make([]hosting.Row, n) },
		"changes":  func(r *hosting.Reply, n int) { r.Changes = make([]hosting.Change, n) },
		"messages": func(r *hosting.Reply, n int) { r.Messages = make([]hosting.Message, n) },
		"outcomes": func(r *hosting.Reply, n int) { r.Outcomes = make([]hosting.Outcome, n) },
		"cells":    func(r *hosting.Reply, n int) { r.Rows = []hosting.Row{{Cells: cells(n)}} },
	} {
		at := &hosting.Reply{Member: "m"}
		fill(at, messages.MaxArrayElements)
		env, err := wire.EnvelopeOf(at)
		if err != nil {
			t.Fatalf("%s at the bound: %v", name, err)
		}
		if _, err := hosting.DecodeReply(env.Cbor); err != nil {
			t.Fatalf("%s at the bound: decode: %v", name, err)
		}
		past := &hosting.Reply{Member: "m"}
		fill(past, messages.MaxArrayElements+1)
		env, err = wire.EnvelopeOf(past)
		if !errors.Is(err, messages.ErrTooLarge) {
			t.Fatalf("%s past the bound: writer returned %v (envelope %v), want ErrTooLarge", name, err, env != nil)
		}
	}
	// A request is held to the same bounds.
	req := &hosting.Request{Op: hosting.OpApply, Events: make([][]byte, messages.MaxArrayElements+1)}
	if _, err := wire.EnvelopeOf(req); !errors.Is(err, messages.ErrTooLarge) {
		t.Fatalf("request past the bound: %v, want ErrTooLarge", err)
	}
}

// bigTable holds rows of a few page-filling columns.
var bigTable = runtime.TableDef{Schema: "app", Table: "blobs", KeyColumns: []string{"id"}, Columns: []string{"a", "b", "c"}}

// fullFramePages runs TestPagesEndBeforeTheFrame at MaxPageBytes with
// more than MaxFrame of data (make soak); otherwise the page byte bound
// is lowered to smallPageBytes and the data scaled down with it.
var fullFramePages = false

const smallPageBytes = 512 << 10

// TestPagesEndBeforeTheFrame: rows, changes and pending messages whose
// full page would pass the page byte bound come in several pages, each
// within it (so within MaxFrame), and listing them all returns every one,
// on the in-process Local and through the wire codec alike.
func TestPagesEndBeforeTheFrame(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ctx = hosting.WithPrincipal(ctx, testTenant)
	limit, colBytes, bodyBytes := smallPageBytes, 20<<10, 64<<10
	if fullFramePages {
		limit, colBytes, bodyBytes = hosting.MaxPageBytes, 60<<10, 900<<10
	} else {
		t.Cleanup(hosting.SetPageByteLimit(limit))
	}
	rowBytes := colBytes * len(bigTable.Columns)
	nRows, nMsgs := 2*limit/rowBytes+3, limit/bodyBytes+2
	if fullFramePages {
		nRows, nMsgs = hosting.MaxFrame/rowBytes+4, hosting.MaxFrame/bodyBytes+2
	}
	signer, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: testMesh, SyncInterval: -1, Name: "blob-writer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = signer.Close() })
	var evs [][]byte
	for i := range nRows {
		ev := &messages.Event{Schema: bigTable.Schema, Table: bigTable.Table, Key: messages.Columns{"id": messages.MustValue(int64(i))}, Payload: messages.Columns{}}
		for _, col := range bigTable.Columns {
			ev.Payload[col] = messages.MustValue(strings.Repeat(col, colBytes-16))
		}
		raw, err := signer.Sign(ev)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, raw)
	}
	id := signer.Identity()
	key := runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}
	body := bytes.Repeat([]byte{'m'}, bodyBytes)
	alice, bob := messages.DeviceAddress{User: "alice", Device: 1}, messages.DeviceAddress{User: "bob", Device: 2}

	for name, l := range placements(t) {
		t.Run(name, func(t *testing.T) {
			c := hosting.Client{P: l}
			create(t, ctx, l, hosting.KindGroup, "blobs")
			if err := c.Trust(ctx, "blobs", key); err != nil {
				t.Fatal(err)
			}
			if err := c.DefineTable(ctx, "blobs", bigTable); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(evs); i += 16 {
				if _, _, err := c.Apply(ctx, "blobs", evs[i:min(i+16, len(evs))]); err != nil {
					t.Fatal(err)
				}
			}
			// Rows: a page ends before the bound; Rows pages through all.
			rows, more, err := c.Scan(ctx, "blobs", bigTable.Schema, bigTable.Table, nil, 0)
			if err != nil || !more || len(rows) == 0 || len(rows) >= nRows {
				t.Fatalf("first scan page: %d of %d rows, more %v, %v", len(rows), nRows, more, err)
			}
			if size := encodedSize(t, rows); size > limit {
				t.Fatalf("first scan page: %d bytes, bound %d", size, limit)
			}
			n := 0
			for r, err := range c.Rows(ctx, "blobs", bigTable.Schema, bigTable.Table, nil) {
				if err != nil {
					t.Fatalf("rows after %d: %v", n, err)
				}
				var got int64
				if err := messages.Value(r.Key["id"]).Decode(&got); err != nil || got != int64(n) {
					t.Fatalf("row %d: key %d %v", n, got, err)
				}
				n++
			}
			if n != nRows {
				t.Fatalf("Rows listed %d of %d", n, nRows)
			}
			// Changes: the same, resuming after each page's Next.
			var next uint64
			for total := 0; total < nRows; {
				chs, nx, err := c.Changes(ctx, "blobs", bigTable.Schema, bigTable.Table, next, 0, time.Second)
				if err != nil || len(chs) == 0 || (total == 0 && len(chs) >= nRows) {
					t.Fatalf("changes after %d of %d: %d, %v", total, nRows, len(chs), err)
				}
				if size := encodedSize(t, chs); size > limit {
					t.Fatalf("changes page after %d: %d bytes, bound %d", total, size, limit)
				}
				for i, ch := range chs {
					var got int64
					if err := messages.Value(ch.Key["id"]).Decode(&got); err != nil || got != int64(total+i) {
						t.Fatalf("change %d: key %d %v", total+i, got, err)
					}
				}
				total, next = total+len(chs), nx
			}

			// Pending received and sent messages: the same.
			create(t, ctx, l, hosting.KindDevice, "alice.1", "bob.2")
			for i := range nMsgs {
				if _, err := c.Send(ctx, alice, bob, messages.LogicalMessageID{byte(i + 1)}, body); err != nil {
					t.Fatal(err)
				}
			}
			for _, dev := range []struct {
				name string
				op   hosting.Op
				addr messages.DeviceAddress
				list func(context.Context, messages.DeviceAddress) ([]hosting.Message, error)
			}{{"bob pending", hosting.OpPending, bob, c.Pending}, {"alice sent", hosting.OpPendingSent, alice, c.PendingSent}} {
				rep, err := l.Request(ctx, hosting.KindDevice, hosting.DeviceIdentity(dev.addr), &hosting.Request{Op: dev.op, Principal: &testTenant})
				if err != nil || !rep.More || len(rep.Messages) == 0 || len(rep.Messages) >= nMsgs {
					t.Fatalf("%s: first page %d of %d, more %v, %v", dev.name, len(rep.Messages), nMsgs, rep.More, err)
				}
				if size := encodedSize(t, rep.Messages); size > limit {
					t.Fatalf("%s: first page %d bytes, bound %d", dev.name, size, limit)
				}
				msgs, err := dev.list(ctx, dev.addr)
				if err != nil || len(msgs) != nMsgs {
					t.Fatalf("%s: %d of %d, %v", dev.name, len(msgs), nMsgs, err)
				}
				for i, m := range msgs {
					if m.ID[0] != byte(i+1) || !bytes.Equal(m.Body, body) {
						t.Fatalf("%s: message %d is %x (%d bytes)", dev.name, i, m.ID, len(m.Body))
					}
				}
			}
		})
	}
}

// encodedSize is the size of a page's items as the reply carries them.
func encodedSize[T any](t *testing.T, items []T) int {
	t.Helper()
	size := 0
	for _, it := range items {
		b, err := messages.Marshal(it)
		if err != nil {
			t.Fatal(err)
		}
		size += len(b)
	}
	return size
}
