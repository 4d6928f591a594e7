package histcheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ok(kind, unit string, k int, call, ret int64, ids ...int) Op {
	return Op{Kind: kind, Unit: unit, K: k, Call: call, Return: ret, OK: true, IDs: ids}
}

func finalEvents(unit string, ids ...int) Op {
	return Op{Kind: KFinalEvents, Unit: unit, IDs: ids, OK: true}
}

func finalMsg(unit string, k int, state string) Op {
	return Op{Kind: KFinalMessage, Unit: unit, K: k, State: state, OK: true}
}

func check(t *testing.T, ops []Op) Result {
	t.Helper()
	return Check(ops, 10*time.Second)
}

func TestGroupHistories(t *testing.T) {
	for _, tc := range []struct {
		name             string
		ops              []Op
		violation, lost  bool
		twice, deposedOK bool
	}{
		{name: "sequential", ops: []Op{
			ok(KApply, "g", 0, 1, 2), ok(KEvents, "g", 0, 3, 4, 0), ok(KApply, "g", 1, 5, 6), ok(KEvents, "g", 0, 7, 8, 0, 1),
			finalEvents("g", 0, 1),
		}},
		{name: "concurrent read sees an apply in flight", ops: []Op{
			ok(KApply, "g", 0, 1, 10), ok(KEvents, "g", 0, 2, 3, 0), ok(KEvents, "g", 0, 4, 5, 0),
			finalEvents("g", 0),
		}},
		{name: "unacknowledged apply may appear", ops: []Op{
			{Kind: KApply, Unit: "g", K: 0, Call: 1}, ok(KEvents, "g", 0, 2, 3), ok(KEvents, "g", 0, 4, 5, 0), finalEvents("g", 0),
		}},
		{name: "stale read after an acknowledged apply", violation: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), ok(KApply, "g", 1, 3, 4), ok(KEvents, "g", 0, 5, 6, 0), finalEvents("g", 0, 1),
		}},
		{name: "event disappears", violation: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), ok(KEvents, "g", 0, 3, 4, 0), ok(KEvents, "g", 0, 5, 6), finalEvents("g", 0),
		}},
		{name: "row reads", ops: []Op{
			ok(KRow, "g", 0, 1, 2), ok(KApply, "g", 0, 3, 4), ok(KRow, "g", 0, 5, 6, 0), ok(KRow, "g", 1, 7, 8), finalEvents("g", 0),
		}},
		{name: "row missing after its apply was acknowledged", violation: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), ok(KRow, "g", 0, 3, 4), finalEvents("g", 0),
		}},
		{name: "row present before its apply was called", violation: true, ops: []Op{
			ok(KRow, "g", 0, 1, 2, 0), ok(KApply, "g", 0, 3, 4), finalEvents("g", 0),
		}},
		{name: "acknowledged apply lost at the end", lost: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), ok(KApply, "g", 1, 3, 4), finalEvents("g", 0),
		}},
		{name: "final read failed", lost: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), {Kind: KFinalEvents, Unit: "g", Err: "hosting: unit not provisioned"},
		}},
		{name: "listed twice", twice: true, ops: []Op{
			ok(KApply, "g", 0, 1, 2), {Kind: KEvents, Unit: "g", Call: 3, Return: 4, OK: true, IDs: []int{0}, Dups: 1}, finalEvents("g", 0),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := check(t, tc.ops)
			if (len(r.Violations) > 0) != tc.violation || (len(r.Lost) > 0) != tc.lost || (len(r.Twice) > 0) != tc.twice || r.Unknown != 0 {
				t.Fatalf("%s: %+v", r, r)
			}
		})
	}
}

func TestPairHistories(t *testing.T) {
	const p = "a>b"
	fin := func(k int, call, ret int64) Op { return ok(KFinalize, p, k, call, ret) }
	for _, tc := range []struct {
		name            string
		ops             []Op
		violation, lost bool
	}{
		{name: "send, read both sides, commit, acked", ops: []Op{
			ok(KSend, p, 0, 1, 2), ok(KInbound, p, 0, 3, 4, 0), ok(KOutbound, p, 0, 3, 4, 0), fin(0, 5, 6),
			ok(KInbound, p, 0, 7, 8), ok(KOutbound, p, 0, 7, 8), finalMsg(p, 0, "committed"),
		}},
		{name: "sender holds it while the send is retried", ops: []Op{
			ok(KSend, p, 0, 1, 20), ok(KOutbound, p, 0, 2, 3, 0), ok(KInbound, p, 0, 4, 5), ok(KInbound, p, 0, 21, 22, 0),
			finalMsg(p, 0, "pending"),
		}},
		{name: "ACK in flight after an unacknowledged finalize", ops: []Op{
			ok(KSend, p, 0, 1, 2), {Kind: KFinalize, Unit: p, K: 0, Call: 3}, ok(KInbound, p, 0, 4, 5), ok(KOutbound, p, 0, 6, 7, 0),
			ok(KOutbound, p, 0, 8, 9), finalMsg(p, 0, "committed"),
		}},
		{name: "finalized at the recipient before its ACK reached the sender", ops: []Op{
			ok(KSend, p, 0, 1, 2), fin(0, 3, 10), ok(KInbound, p, 0, 4, 5), ok(KOutbound, p, 0, 6, 11, 0), ok(KOutbound, p, 0, 12, 13),
			finalMsg(p, 0, "committed"),
		}},
		{name: "pending at the sender before its send was called", violation: true, ops: []Op{
			ok(KOutbound, p, 0, 1, 2, 0), ok(KSend, p, 0, 3, 4), finalMsg(p, 0, "pending"),
		}},
		{name: "arrived message vanishes", violation: true, ops: []Op{
			ok(KSend, p, 0, 1, 2), ok(KInbound, p, 0, 3, 4), finalMsg(p, 0, "pending"),
		}},
		{name: "finalized message pending again", violation: true, ops: []Op{
			ok(KSend, p, 0, 1, 2), fin(0, 3, 4), ok(KInbound, p, 0, 5, 6, 0), finalMsg(p, 0, "committed"),
		}},
		{name: "acknowledged message back at the recipient", violation: true, ops: []Op{
			ok(KSend, p, 0, 1, 2), fin(0, 3, 4), ok(KInbound, p, 0, 5, 6, 0), finalMsg(p, 0, "committed"),
		}},
		{name: "acknowledged send lost", lost: true, ops: []Op{
			ok(KSend, p, 0, 1, 2), finalMsg(p, 0, "absent"),
		}},
		{name: "commit lost", lost: true, ops: []Op{
			ok(KSend, p, 0, 1, 2), fin(0, 3, 4), finalMsg(p, 0, "pending"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := check(t, tc.ops)
			if (len(r.Violations) > 0) != tc.violation || (len(r.Lost) > 0) != tc.lost || r.Unknown != 0 {
				t.Fatalf("%s: %+v", r, r)
			}
		})
	}
}

// TestResent: a message pending again at its sender after its finalize
// was acknowledged (a late duplicate send re-created it) is reported in
// Resent, and is not a violation while the recipient does not take it
// again.
func TestResent(t *testing.T) {
	const p = "a>b"
	r := check(t, []Op{
		ok(KSend, p, 0, 1, 2), ok(KFinalize, p, 0, 3, 4), ok(KOutbound, p, 0, 5, 6, 0), ok(KOutbound, p, 0, 7, 8),
		ok(KInbound, p, 0, 9, 10), finalMsg(p, 0, "committed"),
	})
	if !r.Clean() || len(r.Resent) != 1 || !strings.HasPrefix(r.Resent[0], "a>b#0: ") {
		t.Fatalf("%s: %+v", r, r)
	}
	r = check(t, []Op{ok(KSend, p, 0, 1, 2), ok(KFinalize, p, 0, 3, 4), ok(KOutbound, p, 0, 0, 5, 0), finalMsg(p, 0, "committed")})
	if len(r.Resent) != 0 {
		t.Fatalf("a read called before the finalize returned: %v", r.Resent)
	}
}

func TestDeposed(t *testing.T) {
	rep := func(id string, e uint64, a, s int64) Op {
		return Op{Kind: KEvents, Unit: "g", OK: true, Replies: []Reply{{Target: "group/g", MemberID: id, Epoch: e, Activated: a, Served: s}}}
	}
	if d := Deposed([]Op{rep("m1", 1, 10, 11), rep("m1", 1, 10, 19), rep("m2", 2, 20, 21)}); len(d) != 0 {
		t.Fatalf("handover in order: %v", d)
	}
	if d := Deposed([]Op{rep("m1", 1, 10, 11), rep("m2", 2, 20, 21), rep("m1", 1, 10, 25)}); len(d) != 1 || !strings.Contains(d[0], "epoch 1 served") {
		t.Fatalf("old host served after its successor began: %v", d)
	}
	if d := Deposed([]Op{rep("m1", 1, 10, 11), rep("m2", 1, 10, 12)}); len(d) != 1 || !strings.Contains(d[0], "2 incarnations") {
		t.Fatalf("one epoch, two incarnations: %v", d)
	}
}

func TestReadFileSkipsTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	b, _ := json.Marshal(ok(KApply, "g", 3, 1, 2))
	if err := os.WriteFile(path, append(append(b, '\n'), `{"k":"apply","u":"g","n":4,"ca`...), 0o600); err != nil {
		t.Fatal(err)
	}
	ops, err := ReadFile(path)
	if err != nil || len(ops) != 1 || ops[0].K != 3 || !ops[0].OK {
		t.Fatalf("ops %+v, err %v", ops, err)
	}
}
