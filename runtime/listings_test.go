package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// writeRows writes rows id from..from+count-1 of app.t in batches.
func writeRows(t *testing.T, n *Node, from, count int, col string) {
	t.Helper()
	var b Batch
	for i := from; i < from+count; i++ {
		b.Upsert("app", "t", map[string]any{"id": i}, map[string]any{col: i})
		if b.Len() == 200 || i == from+count-1 {
			if _, err := n.Write(context.Background(), &b); err != nil {
				t.Fatal(err)
			}
			b.Reset()
		}
	}
}

// collectRows lists every row of app.t through Rows.
func collectRows(t *testing.T, n *Node, opts ScanOptions) []Row {
	t.Helper()
	var out []Row
	for r, err := range n.Rows(context.Background(), "app", "t", opts) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func rowDigest(rs []Row) string {
	var b bytes.Buffer
	for _, r := range rs {
		fmt.Fprintf(&b, "%x %v %v %v|", r.Key.Encode(), r.Exists, r.Existence, r.Tomb)
		for _, c := range defT.Columns {
			fmt.Fprintf(&b, "%s %v %x %v;", c, r.Cells[c].State, []byte(r.Cells[c].Value), r.Cells[c].Clock)
		}
	}
	return b.String()
}

// Rows crosses pages (listPage) without losing or repeating a row, skips
// tombstones unless asked (a stretch of tombstones longer than a page
// included), equals what one Scan transaction sees, and resumes after a
// row's key.
func TestRowsPagesResumesAndMatchesScan(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	n.define(defT)
	const rows = 3*listPage + 17
	writeRows(t, n.Node, 0, rows, "a")
	// Delete more than a page of consecutive rows (ids are written in
	// key order for small non-negative integers).
	var b Batch
	for i := 100; i < 100+listPage+40; i++ {
		b.Delete("app", "t", map[string]any{"id": i})
	}
	if _, err := n.Write(n.ctx, &b); err != nil {
		t.Fatal(err)
	}
	for _, all := range []bool{false, true} {
		var viaScan []Row
		if err := n.Scan(n.ctx, "app", "t", ScanOptions{IncludeDeleted: all}, func(r Row) bool { viaScan = append(viaScan, r); return true }); err != nil {
			t.Fatal(err)
		}
		got := collectRows(t, n.Node, ScanOptions{IncludeDeleted: all})
		want := rows - listPage - 40
		if all {
			want = rows
		}
		if len(got) != want || rowDigest(got) != rowDigest(viaScan) {
			t.Fatalf("IncludeDeleted=%v: Rows listed %d rows, Scan %d, want %d (same rows: %v)", all, len(got), len(viaScan), want, rowDigest(got) == rowDigest(viaScan))
		}
		seen := map[string]bool{}
		for _, r := range got {
			k := string(r.Key.Encode())
			if seen[k] {
				t.Fatalf("row %x listed twice", k)
			}
			seen[k] = true
			if !all && !r.Exists {
				t.Fatalf("tombstoned row %x listed without IncludeDeleted", k)
			}
		}
		// Resume after any row: the rest, exactly.
		for _, at := range []int{0, listPage - 1, listPage, len(got) - 1} {
			rest := collectRows(t, n.Node, ScanOptions{After: got[at].Key.Encode(), IncludeDeleted: all})
			if rowDigest(rest) != rowDigest(got[at+1:]) {
				t.Fatalf("IncludeDeleted=%v: resume after row %d: %d rows, want %d", all, at, len(rest), len(got)-at-1)
			}
		}
	}
	// Breaking out stops the listing.
	count := 0
	for range n.Rows(n.ctx, "app", "t", ScanOptions{}) {
		count++
		if count == 3 {
			break
		}
	}
	if count != 3 {
		t.Fatalf("break after 3: %d rows", count)
	}
}

func TestRowsErrors(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	var got []error
	for _, err := range n.Rows(n.ctx, "app", "nope", ScanOptions{}) {
		got = append(got, err)
	}
	if len(got) != 1 || !errors.Is(got[0], ErrUnknownTable) {
		t.Fatalf("unknown table: %v, want one ErrUnknownTable", got)
	}
	n.define(defT)
	writeRows(t, n.Node, 0, 10, "a")
	ctx, cancel := context.WithCancel(n.ctx)
	cancel()
	got = nil
	for _, err := range n.Rows(ctx, "app", "t", ScanOptions{}) {
		got = append(got, err)
	}
	if len(got) != 1 || !errors.Is(got[0], context.Canceled) {
		t.Fatalf("canceled: %v, want one context.Canceled", got)
	}
}

// LogEntries lists the log as Log pages it, crosses pages, resumes after
// an entry's Seq, and ends with ErrClosed after Close.
func TestLogEntriesPagesAndResumes(t *testing.T) {
	n := openTestNode(t, Config{Name: "a", SyncInterval: -1})
	n.define(defT)
	writeRows(t, n.Node, 0, 2*listPage+5, "a")
	var viaLog []LogEntry
	for after := uint64(0); ; {
		page, err := n.Log(n.ctx, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		viaLog = append(viaLog, page...)
		after = page[len(page)-1].Seq
	}
	var got []LogEntry
	for e, err := range n.LogEntries(n.ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if len(got) != 2*listPage+5 || len(got) != len(viaLog) {
		t.Fatalf("LogEntries listed %d, Log %d, want %d", len(got), len(viaLog), 2*listPage+5)
	}
	for i := range got {
		if got[i].Seq != viaLog[i].Seq || got[i].ID != viaLog[i].ID || !bytes.Equal(got[i].Raw, viaLog[i].Raw) {
			t.Fatalf("entry %d: %d %x, Log has %d %x", i, got[i].Seq, got[i].ID, viaLog[i].Seq, viaLog[i].ID)
		}
	}
	mid := got[listPage+2].Seq
	k := 0
	for e, err := range n.LogEntries(n.ctx, mid) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Seq != got[listPage+3+k].Seq {
			t.Fatalf("resume after %d: entry %d is %d, want %d", mid, k, e.Seq, got[listPage+3+k].Seq)
		}
		k++
	}
	if k != len(got)-listPage-3 {
		t.Fatalf("resume after %d: %d entries, want %d", mid, k, len(got)-listPage-3)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	for _, err := range n.LogEntries(n.ctx, 0) {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("after Close: %v, want ErrClosed", err)
		}
	}
}

// The delivery plane's listings: PendingSent and PendingReceived cross
// pages of the device store (device.MaxPageSize), resume after a
// Sequence and filter by peer; PendingReceivedReports lists the same
// messages without bodies. Without a delivery plane each yields
// ErrNoDevice.
func TestPendingListings(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	open := func(name string, addr DeviceAddress) *Node {
		n, err := Open(ctx, Config{InMemory: true, MeshID: []byte("m"), Name: name, SyncInterval: -1,
			Device: &DeviceConfig{Address: addr, Transport: net.DeviceTransport(name, addr), Buffer: 8, MaxPending: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		net.RegisterDevice(name, n)
		return n
	}
	a, b := open("alice", aAddr), open("bob", bAddr)
	const sent = 130 // more than one page of 100
	for i := range sent {
		if _, err := a.Send(ctx, bAddr, fmt.Appendf(nil, "body %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitPending(t, b, sent)

	var out []SentMessage
	for m, err := range a.PendingSent(ctx, 0, nil) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if len(out) != sent {
		t.Fatalf("alice: %d pending sent, want %d", len(out), sent)
	}
	for i := 1; i < len(out); i++ {
		if out[i].Sequence <= out[i-1].Sequence {
			t.Fatalf("pending sent out of order at %d", i)
		}
	}
	rest := 0
	for m, err := range a.PendingSent(ctx, out[101].Sequence, &bAddr) {
		if err != nil {
			t.Fatal(err)
		}
		if m.Sequence != out[102+rest].Sequence {
			t.Fatalf("resumed pending sent %d: sequence %d, want %d", rest, m.Sequence, out[102+rest].Sequence)
		}
		rest++
	}
	if rest != sent-102 {
		t.Fatalf("resumed pending sent: %d, want %d", rest, sent-102)
	}
	other := DeviceAddress{User: "carol", Device: 1}
	for m, err := range a.PendingSent(ctx, 0, &other) {
		t.Fatalf("pending sent to carol: %+v %v", m, err)
	}

	var in []ReceivedMessage
	for m, err := range b.PendingReceived(ctx, 0, &aAddr) {
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, m)
	}
	if len(in) != sent {
		t.Fatalf("bob: %d pending received, want %d", len(in), sent)
	}
	var reports []PendingReport
	for r, err := range b.PendingReceivedReports(ctx, in[9].Sequence) {
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
	}
	if len(reports) != sent-10 {
		t.Fatalf("bob: %d reports after the tenth, want %d", len(reports), sent-10)
	}
	for i, r := range reports {
		if r.Sequence != in[10+i].Sequence || r.Sender != aAddr.String() {
			t.Fatalf("report %d: %+v, want sequence %d from %s", i, r, in[10+i].Sequence, aAddr)
		}
	}

	plain := openTestNode(t, Config{Name: "plain", SyncInterval: -1})
	for _, err := range plain.PendingSent(ctx, 0, nil) {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("PendingSent without a device: %v", err)
		}
	}
	for _, err := range plain.PendingReceived(ctx, 0, nil) {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("PendingReceived without a device: %v", err)
		}
	}
	for _, err := range plain.PendingReceivedReports(ctx, 0) {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatalf("PendingReceivedReports without a device: %v", err)
		}
	}
}
