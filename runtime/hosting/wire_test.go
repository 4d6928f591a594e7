package hosting_test

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/syncmesh/syncmesh/actors/device"
	"github.com/syncmesh/syncmesh/actors/outbound"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/messages/wire"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
)

func sampleRequest() *hosting.Request {
	return &hosting.Request{
		Op: hosting.OpSend, Events: [][]byte{{1, 2}}, Table: &hosting.Table{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}},
		Signer: &hosting.Signer{Kid: []byte{1}, Site: make([]byte, 16), PublicKey: make([]byte, 32), Cutoff: 9},
		Schema: "s", TableName: "t", RowKey: messages.Columns{"id": messages.MustValue(int64(3))}, After: []byte{4}, Seq: 5, Limit: 6,
		Peer: &messages.DeviceAddress{User: "bob", Device: 2}, ID: make([]byte, 16), Body: []byte("hi"), Envelope: []byte{7},
		Principal: &hosting.Principal{Tenant: "t"}, Caller: "member0", Reason: 1, MaxAge: 8, Wait: 9,
	}
}

func sampleReply() *hosting.Reply {
	return &hosting.Reply{
		Member: "m", Code: hosting.CodeFailed, Error: "boom", Outcomes: []hosting.Outcome{{Kind: 1, ID: make([]byte, 32)}},
		Found: true, Rows: []hosting.Row{{Key: messages.Columns{"id": messages.MustValue("k")}, Exists: true, Cells: map[string]hosting.Cell{"a": {State: 1, Value: messages.Null}, "b": {}}}},
		IDs: [][]byte{make([]byte, 32)}, Next: 3, More: true, Count: 4, Hash: []byte{5}, Bundle: []byte{6},
		Messages: []hosting.Message{{Peer: messages.DeviceAddress{User: "a", Device: 1}, ID: make([]byte, 16), Seq: 7, Body: []byte("b"), Status: 1, AckSent: true, Duplicate: true}}, Kind: 2,
		Changes: []hosting.Change{{Seq: 10, Key: messages.Columns{"id": messages.MustValue("k")}, Exists: true, Cells: map[string]hosting.Cell{"a": {State: 1, Value: messages.Null}}, Cause: 1}},
	}
}

// Both hosting messages cross the remote inside the one wire.Envelope and
// come back equal.
func TestWireRoundTripThroughEnvelope(t *testing.T) {
	req := sampleRequest()
	env, err := wire.EnvelopeOf(req)
	if err != nil || env.Type != hosting.TypeRequest {
		t.Fatal(env, err)
	}
	back, err := env.Deserialize()
	if err != nil || !reflect.DeepEqual(back, req) {
		t.Fatalf("request: %+v %v", back, err)
	}
	rep := sampleReply()
	env, err = wire.EnvelopeOf(rep)
	if err != nil || env.Type != hosting.TypeReply {
		t.Fatal(env, err)
	}
	back, err = env.Deserialize()
	if err != nil || !reflect.DeepEqual(back, rep) {
		t.Fatalf("reply: %+v %v", back, err)
	}
	// A corrupt frame becomes an Undecodable, never an error or a panic.
	env.Cbor = env.Cbor[:len(env.Cbor)-1]
	back, err = env.Deserialize()
	var u *wire.Undecodable
	if err != nil || !errors.As(back.(error), &u) || !u.Known || !errors.Is(u, messages.ErrMalformed) {
		t.Fatalf("truncated reply: %#v %v", back, err)
	}
}

func TestDecodersRejectBadInput(t *testing.T) {
	good, err := messages.Marshal(sampleRequest())
	if err != nil {
		t.Fatal(err)
	}
	noOp, _ := messages.Marshal(map[int]any{2: [][]byte{{1}}})
	unknownField, _ := messages.Marshal(map[int]any{1: 1, 99: 1})
	for name, b := range map[string][]byte{
		"empty": nil, "trailing": append(append([]byte(nil), good...), 0), "no op": noOp, "unknown field": unknownField,
		"wrong type": {0x61, 'x'}, "too large": make([]byte, hosting.MaxFrame+1),
	} {
		if _, err := hosting.DecodeRequest(b); err == nil {
			t.Errorf("request %s: accepted", name)
		}
	}
	if _, err := hosting.DecodeReply([]byte{0x01}); err == nil {
		t.Error("reply of an integer: accepted")
	}
	if _, err := hosting.DecodeReply(unknownField); err == nil {
		t.Error("reply with an unknown field: accepted")
	}
}

func TestReplyErrorsMatchSentinels(t *testing.T) {
	for code, want := range map[hosting.Code]error{
		hosting.CodeUnavailable:    hosting.ErrUnavailable,
		hosting.CodeBadRequest:     hosting.ErrBadRequest,
		hosting.CodeFailed:         hosting.ErrFailed,
		hosting.CodeNotHandedOff:   device.ErrNotHandedOff,
		hosting.CodeNotPending:     outbound.ErrNotPending,
		hosting.CodeUnknownTable:   runtime.ErrUnknownTable,
		hosting.CodeForbidden:      hosting.ErrForbidden,
		hosting.CodeNotProvisioned: hosting.ErrNotProvisioned,
		hosting.CodeQuota:          hosting.ErrQuota,
		hosting.CodeLagged:         runtime.ErrWatchLagged,
		hosting.CodeRestored:       runtime.ErrWatchRestored,
	} {
		err := (&hosting.Reply{Code: code, Error: "x"}).Err()
		var re *hosting.ReplyError
		if !errors.Is(err, want) || !errors.As(err, &re) || re.Code != code {
			t.Errorf("code %d: %v does not match %v", code, err, want)
		}
		if errors.Is(err, hosting.ErrClosed) {
			t.Errorf("code %d matches ErrClosed", code)
		}
	}
	if (&hosting.Reply{}).Err() != nil {
		t.Error("CodeOK is an error")
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []*hosting.Request{sampleRequest(), {Op: hosting.OpInfo}, {Op: hosting.OpApply, Events: [][]byte{{0xd2}}}} {
		b, err := messages.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := hosting.DecodeRequest(b)
		if err != nil {
			return
		}
		again, err := messages.Marshal(r)
		if err != nil {
			t.Fatalf("decoded request does not encode: %v", err)
		}
		r2, err := hosting.DecodeRequest(again)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-encoded request differs: %v", err)
		}
	})
}

func FuzzDecodeReply(f *testing.F) {
	for _, r := range []*hosting.Reply{sampleReply(), {Member: "m"}} {
		b, err := messages.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xa1, 0x01, 0x60})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := hosting.DecodeReply(b)
		if err != nil {
			return
		}
		again, err := messages.Marshal(r)
		if err != nil {
			t.Fatalf("decoded reply does not encode: %v", err)
		}
		if r2, err := hosting.DecodeReply(again); err != nil || !bytes.Equal(mustMarshal(t, r2), again) {
			t.Fatalf("re-encoded reply differs: %v", err)
		}
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
