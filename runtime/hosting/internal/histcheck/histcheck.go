// Package histcheck checks the history of client operations recorded by
// the fault harness of runtime/hosting (internal/etcdcluster's history
// client, TestClusterFaultsEtcd): every operation's call and return time
// and its result, one JSON line each.
//
// Check runs four checks:
//
//   - linearizability (github.com/anishathalye/porcupine) of every unit's
//     history against a model of what the unit promises: a group's
//     retained events are exactly the events whose apply linearized
//     before (GroupModel); between two devices, each message moves from
//     sent to received-pending to finalized at the recipient to
//     acknowledged at the sender, never back (PairModel);
//   - nothing acknowledged lost: the final reads (after every fault was
//     healed) hold every acknowledged apply, send and commit or discard;
//   - nothing applied twice: no read lists an event or a message twice,
//     and no final read finds a message both pending and finalized;
//   - no reply from a deposed host: from the activation information every
//     reply carries (member id, activation epoch, activation and serve
//     times), no reply of an activation was served after a later
//     activation of the unit began, and each epoch belongs to one
//     incarnation.
package histcheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Operation kinds.
const (
	// KApply applies the group event number K (Unit: the group).
	KApply = "apply"
	// KEvents reads a group's events (IDs: the numbers K of the events
	// this client applied that the read listed).
	KEvents = "events"
	// KRow reads the row a group's event number K writes (IDs: [K] when
	// the row exists, empty otherwise).
	KRow = "row"
	// KSend sends message K from Pair's sender to its recipient.
	KSend = "send"
	// KFinalize commits (Discard false) or discards message K at the
	// recipient; OK means finalized and its ACK handed to the sender.
	KFinalize = "fin"
	// KInbound reads the recipient's pending received messages from the
	// sender (IDs: message numbers).
	KInbound = "in"
	// KOutbound reads the sender's pending sent messages to the recipient.
	KOutbound = "out"
	// KFinalEvents is the final read of a group's events.
	KFinalEvents = "final-events"
	// KFinalMessage is the final state of message K: State is "pending"
	// (at the recipient), "committed", "discarded", "sent-only" (held by
	// the sender alone), "absent", or "" with Err set.
	KFinalMessage = "final-msg"
)

// Reply is the activation information of one successful reply.
type Reply struct {
	Target    string `json:"t"` // kind/identity of the unit that answered
	Member    string `json:"m"`
	MemberID  string `json:"id"`
	Epoch     uint64 `json:"e"`
	Activated int64  `json:"a"`
	Served    int64  `json:"s"`
}

// Op is one recorded client operation: one line of a history file. A
// mutating operation retried until acknowledged (every one is
// idempotent) is one Op from the first call to the acknowledgement.
type Op struct {
	Kind string `json:"k"`
	// Unit is the partition: a group's name, or "sender>recipient" for
	// the messages between two devices.
	Unit    string `json:"u"`
	Client  int    `json:"c"`
	K       int    `json:"n,omitempty"`
	Discard bool   `json:"disc,omitempty"`
	IDs     []int  `json:"ids,omitempty"`
	// Dups counts entries a read listed more than once.
	Dups  int    `json:"dups,omitempty"`
	State string `json:"st,omitempty"`
	Call  int64  `json:"call"`
	// Return is 0 when the operation never returned an acknowledgement.
	Return  int64   `json:"ret,omitempty"`
	OK      bool    `json:"ok,omitempty"`
	Err     string  `json:"err,omitempty"`
	Replies []Reply `json:"r,omitempty"`
}

// ReadFile reads a history file (JSON lines; a torn last line, from a
// killed writer, is ignored).
func ReadFile(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Op
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var op Op
		if json.Unmarshal(sc.Bytes(), &op) == nil && op.Kind != "" {
			out = append(out, op)
		}
	}
	return out, sc.Err()
}

// Result is what Check found. Clean reports whether every list is empty.
type Result struct {
	Ops int
	// Partitions is the number of unit histories checked; Unknown those
	// whose check timed out (neither passed nor failed).
	Partitions, Unknown int
	// UnknownUnits names the unit histories whose check timed out.
	UnknownUnits []string
	// Violations names each unit history that is not linearizable.
	Violations []string
	// Explained describes each violation: the operations around the
	// earliest call at which the unit's history stops being
	// linearizable.
	Explained []string
	// Lost lists acknowledged operations the final reads do not show.
	Lost []string
	// Twice lists effects applied more than once.
	Twice []string
	// Deposed lists replies served by an activation after a later one
	// began, and epochs answered by more than one incarnation.
	Deposed []string
	// Resent lists messages seen pending at their sender again after
	// their finalize (commit or discard, its ACK handed to the sender)
	// was acknowledged: a late duplicate of the send re-created them.
	// Not counted by Clean (the recipient does not take them again: that
	// would be a violation), but reported.
	Resent []string
	// Missing lists final reads that failed (their units' acknowledged
	// operations are counted in Lost too).
	Missing []string
}

// Clean reports whether no check found anything.
func (r Result) Clean() bool {
	return len(r.Violations)+len(r.Lost)+len(r.Twice)+len(r.Deposed)+r.Unknown == 0
}

// String summarizes the result on one line.
func (r Result) String() string {
	return fmt.Sprintf("%d ops, %d unit histories: %d not linearizable, %d unknown (check timed out), %d acknowledged lost, %d applied twice, %d deposed replies; %d acknowledged messages pending again at their sender",
		r.Ops, r.Partitions, len(r.Violations), r.Unknown, len(r.Lost), len(r.Twice), len(r.Deposed), len(r.Resent))
}

// Check checks ops; timeout bounds the linearizability check of one
// unit's history.
func Check(ops []Op, timeout time.Duration) Result {
	res := Result{Ops: len(ops)}
	checkLinearizable(ops, timeout, &res)
	checkFinal(ops, &res)
	for _, op := range ops {
		if op.Dups > 0 {
			res.Twice = append(res.Twice, fmt.Sprintf("%s read on %s listed %d entries twice", op.Kind, op.Unit, op.Dups))
		}
	}
	res.Deposed = Deposed(ops)
	res.Resent = resent(ops)
	return res
}

// Pair is the partition name of the messages from one device to another.
func Pair(from, to string) string { return from + ">" + to }

// infinity is the return time of an operation that never returned: it
// may take effect at any time after its call.
const infinity = math.MaxInt64

func checkLinearizable(ops []Op, timeout time.Duration, res *Result) {
	groups := map[string][]porcupine.Operation{}
	pairs := map[string][]porcupine.Operation{}
	for _, op := range ops {
		ret := op.Return
		if !op.OK || ret == 0 {
			ret = infinity
		}
		in := input{kind: op.Kind, k: op.K, ids: op.IDs, ok: op.OK}
		if op.Kind == KEvents || op.Kind == KInbound || op.Kind == KOutbound {
			in.bits = bitsOf(op.IDs)
		}
		if (op.Kind == KEvents || op.Kind == KRow || op.Kind == KInbound || op.Kind == KOutbound) && !op.OK {
			continue // a read without a result tells nothing
		}
		p := porcupine.Operation{ClientId: op.Client, Input: in, Call: op.Call, Output: op.OK, Return: ret}
		switch op.Kind {
		case KApply, KEvents, KRow:
			groups[op.Unit] = append(groups[op.Unit], p)
		case KInbound, KOutbound:
			pairs[op.Unit] = append(pairs[op.Unit], p)
		case KSend, KFinalize:
			steps := []string{stepStore, stepArrive}
			if op.Kind == KFinalize {
				steps = []string{stepFinal, stepAck}
			}
			for _, st := range steps {
				in.kind = st
				p.Input = in
				pairs[op.Unit] = append(pairs[op.Unit], p)
			}
		}
	}
	run := func(m porcupine.Model, hist map[string][]porcupine.Operation) {
		for _, u := range sortedKeys(hist) {
			res.Partitions++
			switch porcupine.CheckOperationsTimeout(m, hist[u], timeout) {
			case porcupine.Illegal:
				res.Violations = append(res.Violations, u)
				res.Explained = append(res.Explained, u+": "+explain(m, hist[u], timeout))
			case porcupine.Unknown:
				res.Unknown++
				res.UnknownUnits = append(res.UnknownUnits, u)
			}
		}
	}
	run(GroupModel(), groups)
	run(PairModel(), pairs)
}

// explain finds, by bisection over the calls, the shortest prefix of
// hist (the operations called up to some time) that is not linearizable
// and describes its last operations.
func explain(m porcupine.Model, hist []porcupine.Operation, timeout time.Duration) string {
	ops := slices.Clone(hist)
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	// Bounded: proving a prefix illegal can take long on a big history;
	// past the budget the prefix found so far is reported.
	step := min(timeout, 10*time.Second)
	deadline := time.Now().Add(2 * time.Minute)
	lo, hi := 1, len(ops) // ops[:hi] is not linearizable
	for lo < hi && time.Now().Before(deadline) {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(m, ops[:mid], step) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "not linearizable from operation %d of %d on:", hi, len(ops))
	for _, op := range ops[max(0, hi-6):hi] {
		ret := "never"
		if op.Return != infinity {
			ret = strconv.FormatInt(op.Return-ops[0].Call, 10)
		}
		fmt.Fprintf(&b, " [%s call %d return %s]", describe(op.Input, op.Output), op.Call-ops[0].Call, ret)
	}
	return b.String()
}

type input struct {
	kind string
	k    int
	ids  []int
	ok   bool
	// bits is an events read's listed set in the group state's form
	// (compared whole: a read of thousands of events is one comparison).
	bits string
}

// bitsOf is the group state ('1' per listed number, trailing '0's
// trimmed) that lists exactly ids.
func bitsOf(ids []int) string {
	b := make([]byte, maxOf(ids)+1)
	for i := range b {
		b[i] = '0'
	}
	for _, k := range ids {
		b[k] = '1'
	}
	return trim(string(b))
}

// set returns state (a string of per-number states) with entry k set to
// c, extended with '0' as needed.
func set(state string, k int, c byte) string {
	b := []byte(state)
	for len(b) <= k {
		b = append(b, '0')
	}
	b[k] = c
	return string(b)
}

func at(state string, k int) byte {
	if k < len(state) {
		return state[k]
	}
	return '0'
}

// GroupModel is a group's events: the state is one byte per event number
// of the client ('1': retained). An acknowledged apply retains its event;
// an apply without an acknowledgement may or may not have; a read lists
// exactly the retained events; a row read finds the row an event writes
// exactly when the event is retained.
func GroupModel() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{""} },
		Step: func(st, in, _ interface{}) []interface{} {
			s, op := st.(string), in.(input)
			switch op.kind {
			case KApply:
				if op.ok {
					return []interface{}{set(s, op.k, '1')}
				}
				return []interface{}{s, set(s, op.k, '1')}
			case KEvents:
				if trim(s) != op.bits {
					return nil
				}
				return []interface{}{s}
			case KRow:
				if (at(s, op.k) == '1') != slices.Contains(op.ids, op.k) {
					return nil
				}
				return []interface{}{s}
			}
			return nil
		},
		Equal:             func(a, b interface{}) bool { return trim(a.(string)) == trim(b.(string)) },
		DescribeOperation: describe,
	}
	return m.ToModel()
}

// Message states of PairModel.
const (
	msgNone      = '0' // not sent
	msgSent      = '1' // held by the sender only (not handed off yet)
	msgArrived   = '2' // pending at the sender and at the recipient
	msgFinalized = '3' // finalized at the recipient; the sender still waits for its ACK
	msgAcked     = '4' // finalized and acknowledged: held by neither
)

// The steps of PairModel: a send is two (the sender stores the message,
// then hands it off: it arrives), a finalize is two (the recipient
// finalizes it, then its ACK reaches the sender), each pair recorded with
// the interval of the one client operation, because each step happens on
// a different unit at its own time within it.
const (
	stepStore  = "store"
	stepArrive = "arrive"
	stepFinal  = "final"
	stepAck    = "ack"
)

// pairSteps are the steps of a send or finalize, in order, each with
// the state it needs and the state it leads to.
var pairSteps = map[string][2]byte{
	stepStore:  {msgNone, msgSent},
	stepArrive: {msgSent, msgArrived},
	stepFinal:  {msgArrived, msgFinalized},
	stepAck:    {msgFinalized, msgAcked},
}

// PairModel is the messages between a sender and a recipient device: the
// state is one byte per message number (msgNone … msgAcked). A message
// only moves forward, one step at a time: an acknowledged send was stored
// by the sender and arrived at the recipient, an acknowledged finalize
// (commit or discard) finalized it and its ACK reached the sender; a step
// of an operation without an acknowledgement may or may not have
// happened. A read of the recipient's pending messages lists exactly the
// arrived ones; a read of the sender's pending sent messages lists
// exactly the stored and not yet acknowledged ones.
func PairModel() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{""} },
		Step: func(st, in, _ interface{}) []interface{} {
			s, op := st.(string), in.(input)
			if step, ok := pairSteps[op.kind]; ok {
				c := at(s, op.k)
				switch {
				case c == step[0] && op.ok:
					return []interface{}{set(s, op.k, step[1])}
				case c == step[0]:
					return []interface{}{s, set(s, op.k, step[1])}
				case c > step[0]:
					return []interface{}{s} // done already (a repeat)
				case op.ok:
					return nil // the step before it never happened
				}
				return []interface{}{s}
			}
			if op.kind != KInbound && op.kind != KOutbound {
				return nil
			}
			for k := 0; k < max(len(s), len(op.bits)); k++ {
				c, listed := at(s, k), at(op.bits, k) == '1'
				held := c == msgArrived
				if op.kind == KOutbound {
					held = c >= msgSent && c <= msgFinalized
					if c == msgAcked && listed {
						// Pending again at its sender after its ACK: a
						// late duplicate of its send re-created it (at
						// least once delivery of requests). Reported
						// apart (Result.Resent), not a linearizability
						// violation: the recipient does not take it again
						// (an inbound read listing it is one).
						continue
					}
				}
				if held != listed {
					return nil
				}
			}
			return []interface{}{s}
		},
		Equal:             func(a, b interface{}) bool { return trim(a.(string)) == trim(b.(string)) },
		DescribeOperation: describe,
	}
	return m.ToModel()
}

func trim(s string) string { return strings.TrimRight(s, "0") }

func maxOf(ids []int) int {
	m := -1
	for _, k := range ids {
		m = max(m, k)
	}
	return m
}

func describe(in, out interface{}) string {
	op := in.(input)
	return fmt.Sprintf("%s(%d %v) ok=%v", op.kind, op.k, op.ids, out)
}

// checkFinal compares the acknowledged operations with the final reads.
func checkFinal(ops []Op, res *Result) {
	finalEvents := map[string]Op{}
	finalMsg := map[string]Op{}
	key := func(op Op) string { return fmt.Sprintf("%s#%d", op.Unit, op.K) }
	for _, op := range ops {
		switch op.Kind {
		case KFinalEvents:
			finalEvents[op.Unit] = op
			if op.Err != "" {
				res.Missing = append(res.Missing, fmt.Sprintf("events of %s: %s", op.Unit, op.Err))
			}
		case KFinalMessage:
			finalMsg[key(op)] = op
			if op.Err != "" {
				res.Missing = append(res.Missing, fmt.Sprintf("message %s: %s", key(op), op.Err))
			}
		}
	}
	for _, op := range ops {
		if !op.OK {
			continue
		}
		switch op.Kind {
		case KApply:
			f, ok := finalEvents[op.Unit]
			if !ok || f.Err != "" || !slices.Contains(f.IDs, op.K) {
				res.Lost = append(res.Lost, fmt.Sprintf("apply %s#%d", op.Unit, op.K))
			}
		case KSend:
			f, ok := finalMsg[key(op)]
			if !ok || f.Err != "" || (f.State != "pending" && f.State != "committed" && f.State != "discarded") {
				res.Lost = append(res.Lost, "send "+key(op))
			}
		case KFinalize:
			want := "committed"
			if op.Discard {
				want = "discarded"
			}
			f, ok := finalMsg[key(op)]
			if !ok || f.State != want {
				res.Lost = append(res.Lost, fmt.Sprintf("%s %s (final: %q %s)", want, key(op), f.State, f.Err))
			}
		}
	}
	for _, f := range finalMsg {
		if f.Dups > 0 {
			res.Twice = append(res.Twice, "message "+key(f)+" both pending and finalized")
		}
	}
}

// resent lists the messages a read of their sender's pending sent
// messages listed after their finalize was acknowledged.
func resent(ops []Op) []string {
	done := map[string]int64{} // pair#k → when its finalize returned
	key := func(u string, k int) string { return fmt.Sprintf("%s#%d", u, k) }
	for _, op := range ops {
		if op.Kind == KFinalize && op.OK {
			done[key(op.Unit, op.K)] = op.Return
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, op := range ops {
		if op.Kind != KOutbound || !op.OK {
			continue
		}
		for _, k := range op.IDs {
			kk := key(op.Unit, k)
			if ret, ok := done[kk]; ok && ret < op.Call && !seen[kk] {
				seen[kk] = true
				out = append(out, fmt.Sprintf("%s: finalized and acknowledged, pending at the sender %v later", kk, time.Duration(op.Call-ret).Round(time.Millisecond)))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Deposed checks the activation information of every reply: each epoch
// of a unit is answered by one incarnation, and no reply of an epoch was
// served after a later epoch's activation began.
func Deposed(ops []Op) []string {
	type act struct {
		ids       map[string]bool
		activated int64
		lastServe int64
	}
	units := map[string]map[uint64]*act{}
	for _, op := range ops {
		for _, r := range op.Replies {
			if units[r.Target] == nil {
				units[r.Target] = map[uint64]*act{}
			}
			a := units[r.Target][r.Epoch]
			if a == nil {
				a = &act{ids: map[string]bool{}, activated: r.Activated}
				units[r.Target][r.Epoch] = a
			}
			a.ids[r.MemberID] = true
			a.lastServe = max(a.lastServe, r.Served)
		}
	}
	var out []string
	for _, u := range sortedKeys(units) {
		acts := units[u]
		epochs := make([]uint64, 0, len(acts))
		for e, a := range acts {
			epochs = append(epochs, e)
			if len(a.ids) != 1 {
				out = append(out, fmt.Sprintf("%s epoch %d answered by %d incarnations", u, e, len(a.ids)))
			}
		}
		sort.Slice(epochs, func(i, j int) bool { return epochs[i] < epochs[j] })
		// Every earlier epoch's last reply precedes every later epoch's
		// activation.
		var lastServe int64
		var lastEpoch uint64
		for _, e := range epochs {
			a := acts[e]
			if lastServe >= a.activated {
				out = append(out, fmt.Sprintf("%s: epoch %d served at %d, after epoch %d began at %d", u, lastEpoch, lastServe, e, a.activated))
			}
			if a.lastServe > lastServe {
				lastServe, lastEpoch = a.lastServe, e
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
