package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/scenario"
)

// frameReport is what the frame check measured.
type frameReport struct {
	Via, Host       string // the member asked and the member hosting the group
	RequestBytes    int    // the apply request's events
	Rows            int    // rows of the one scan page that came back
	ReplyBytes      int    // their cells' bytes
	OversizeRefused string // how the apply past MaxFrame was refused
	OversizeTook    string
}

// frameTable holds rows of three 80 KiB columns: an event of ~240 KiB
// (within messages.MaxEventSize).
var frameTable = runtime.TableDef{Schema: "app", Table: "frames", KeyColumns: []string{"id"}, Columns: []string{"a", "b", "c"}}

// checkFrames applies, through member 0, ~6 MiB of events in one request
// on a group hosted on another member and scans them back in one reply
// (both more than gRPC's default 4 MiB message), then applies more than
// MaxFrame in one request, which must be refused at once with
// messages.ErrTooLarge instead of timing out.
func checkFrames(ctx context.Context, ms []*hosting.Cluster, mesh []byte, logf func(string, ...any)) (frameReport, error) {
	rep := frameReport{Via: ms[0].Member()}
	ctx = hosting.WithPrincipal(ctx, scenario.Tenant)
	c := hosting.Client{P: ms[0]}
	group := ""
	for i := 0; group == "" && i < 64; i++ {
		g := fmt.Sprintf("frames-%d", i)
		m, err := c.Create(ctx, hosting.KindGroup, g)
		if err != nil {
			return rep, err
		}
		if m != rep.Via {
			group, rep.Host = g, m
		}
	}
	if group == "" {
		return rep, errors.New("no group placed off member 0")
	}
	signer, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: mesh, SyncInterval: -1, Name: "frames-writer"})
	if err != nil {
		return rep, err
	}
	defer signer.Close()
	id := signer.Identity()
	if err := c.Trust(ctx, group, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		return rep, err
	}
	if err := c.DefineTable(ctx, group, frameTable); err != nil {
		return rep, err
	}
	sign := func(from, n int) ([][]byte, int, error) {
		var evs [][]byte
		size := 0
		for i := from; i < from+n; i++ {
			ev := &messages.Event{Schema: frameTable.Schema, Table: frameTable.Table, Key: messages.Columns{"id": messages.MustValue(int64(i))}, Payload: messages.Columns{}}
			for _, col := range frameTable.Columns {
				ev.Payload[col] = messages.MustValue(strings.Repeat(col, 80<<10))
			}
			raw, err := signer.Sign(ev)
			if err != nil {
				return nil, 0, err
			}
			evs, size = append(evs, raw), size+len(raw)
		}
		return evs, size, nil
	}
	evs, size, err := sign(0, 24)
	if err != nil {
		return rep, err
	}
	rep.RequestBytes = size
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	outs, host, err := c.Apply(actx, group, evs)
	cancel()
	if err != nil {
		return rep, fmt.Errorf("apply %d bytes on %s from %s: %w", size, rep.Host, rep.Via, err)
	}
	if host != rep.Host {
		return rep, fmt.Errorf("applied on %s, placed on %s", host, rep.Host)
	}
	for _, o := range outs {
		// Duplicate: an attempt that timed out had applied it (requests
		// are at least once).
		if o.Kind != messages.Applied && o.Kind != messages.Duplicate {
			return rep, fmt.Errorf("apply: outcome %v", o)
		}
	}
	logf("applied %d bytes in one request %s → %s", size, rep.Via, rep.Host)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	rows, more, err := c.Scan(sctx, group, frameTable.Schema, frameTable.Table, nil, 0)
	cancel()
	if err != nil {
		return rep, fmt.Errorf("scan from %s: %w", rep.Via, err)
	}
	rep.Rows = len(rows)
	for _, r := range rows {
		for _, cell := range r.Cells {
			rep.ReplyBytes += len(cell.Value)
		}
	}
	if more || len(rows) != len(evs) || rep.ReplyBytes < 5<<20 {
		return rep, fmt.Errorf("scan: %d rows (%d bytes), more %v; want %d in one page", len(rows), rep.ReplyBytes, more, len(evs))
	}
	logf("scanned %d bytes in one reply %s → %s", rep.ReplyBytes, rep.Host, rep.Via)

	big, size, err := sign(len(evs), hosting.MaxFrame/(size/len(evs))+8)
	if err != nil {
		return rep, err
	}
	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, _, err = c.Apply(octx, group, big)
	cancel()
	rep.OversizeTook = time.Since(start).Round(time.Millisecond).String()
	if !errors.Is(err, messages.ErrTooLarge) || !errors.Is(err, hosting.ErrBadRequest) {
		return rep, fmt.Errorf("apply of %d bytes (MaxFrame %d) after %s: %v, want ErrBadRequest and messages.ErrTooLarge", size, hosting.MaxFrame, rep.OversizeTook, err)
	}
	rep.OversizeRefused = err.Error()
	return rep, nil
}
