package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

func TestReconcileTypesRoundTrip(t *testing.T) {
	req := &ReconcileRequest{From: "a", To: "b", Kind: 1, Body: []byte{1, 2, 3}}
	got, ok := roundTrip(t, req).(*ReconcileRequest)
	if !ok || got.From != "a" || got.To != "b" || got.Kind != 1 || !bytes.Equal(got.Body, req.Body) || got.Size == 0 {
		t.Fatalf("request round trip: %+v", got)
	}
	for _, rep := range []*ReconcileReply{
		{Status: ReconcileOK, Body: []byte{9}},
		{Status: ReconcileBusy, Reason: "busy"},
		{Status: ReconcileInvalid, Reason: "bad"},
		{Status: ReconcileFailed},
	} {
		got, ok := roundTrip(t, rep).(*ReconcileReply)
		if !ok || got.Status != rep.Status || !bytes.Equal(got.Body, rep.Body) || got.Reason != rep.Reason {
			t.Fatalf("reply round trip of %+v: %+v", rep, got)
		}
	}
}

// The writer refuses what the reader refuses, at and past each limit.
func TestReconcileWireLimitsAtAndPastTheEdge(t *testing.T) {
	atReq := &ReconcileRequest{From: strings.Repeat("f", maxReconcileName), To: strings.Repeat("t", maxReconcileName), Kind: 2, Body: make([]byte, MaxReconcileRequestBody)}
	env, err := EnvelopeOf(atReq)
	if err != nil {
		t.Fatalf("request at the limits: %v", err)
	}
	if v, _ := env.Deserialize(); reflect.TypeOf(v) != reflect.TypeOf(&ReconcileRequest{}) {
		t.Fatalf("request at the limits decodes to %T: %v", v, v)
	}
	atRep := &ReconcileReply{Status: ReconcileOK, Body: make([]byte, MaxReconcileReplyBody)}
	env, err = EnvelopeOf(atRep)
	if err != nil {
		t.Fatalf("reply at the limit: %v", err)
	}
	if v, _ := env.Deserialize(); reflect.TypeOf(v) != reflect.TypeOf(&ReconcileReply{}) {
		t.Fatalf("reply at the limit decodes to %T", v)
	}

	bad := map[string]any{
		"body past the limit":  &ReconcileRequest{From: "a", Kind: 1, Body: make([]byte, MaxReconcileRequestBody+1)},
		"from past the limit":  &ReconcileRequest{From: strings.Repeat("f", maxReconcileName+1), Kind: 1, Body: []byte{1}},
		"to past the limit":    &ReconcileRequest{From: "a", To: strings.Repeat("t", maxReconcileName+1), Kind: 1, Body: []byte{1}},
		"no from":              &ReconcileRequest{Kind: 1, Body: []byte{1}},
		"kind 0":               &ReconcileRequest{From: "a", Body: []byte{1}},
		"empty body":           &ReconcileRequest{From: "a", Kind: 1},
		"reply past the limit": &ReconcileReply{Status: ReconcileOK, Body: make([]byte, MaxReconcileReplyBody+1)},
		"empty ok reply":       &ReconcileReply{Status: ReconcileOK},
		"refusal with a body":  &ReconcileReply{Status: ReconcileBusy, Body: []byte{1}},
		"unknown status":       &ReconcileReply{Status: reconcileStatuses, Reason: "x"},
	}
	for name, m := range bad {
		var typ string
		var raw []byte
		var err error
		switch x := m.(type) {
		case *ReconcileRequest:
			_, err = EnvelopeOf(x)
			typ = TypeReconcileRequest
			raw, _ = messages.Marshal(x)
		case *ReconcileReply:
			_, err = EnvelopeOf(x)
			typ = TypeReconcileReply
			raw, _ = messages.Marshal(x)
		}
		if err == nil {
			t.Errorf("%s: the writer accepted it", name)
		}
		// The reader refuses the same bytes (encoded without the writer's
		// check), as an undecodable frame, never a panic.
		v, derr := (&Envelope{Type: typ, Cbor: raw}).Deserialize()
		u, ok := v.(*Undecodable)
		if derr != nil || !ok || !u.Known {
			t.Errorf("%s: the reader gave %T %v", name, v, derr)
		}
		if ok && !errors.Is(u.Err, messages.ErrMalformed) && !errors.Is(u.Err, messages.ErrTooLarge) {
			t.Errorf("%s: untyped error %v", name, u.Err)
		}
	}
	// A long or invalid reason is cut, never refused: a refusal always
	// reaches the requester.
	env, err = EnvelopeOf(&ReconcileReply{Status: ReconcileFailed, Reason: strings.Repeat("é", MaxRejectedReason) + "\xff"})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := env.Deserialize()
	if r, ok := v.(*ReconcileReply); !ok || len(r.Reason) > MaxRejectedReason {
		t.Fatalf("long reason: %T %+v", v, v)
	}
}

func FuzzReconcileWire(f *testing.F) {
	req, _ := messages.Marshal(&ReconcileRequest{From: "a", To: "b", Kind: 1, Body: []byte{1}})
	rep, _ := messages.Marshal(&ReconcileReply{Status: ReconcileOK, Body: []byte{1}})
	f.Add(true, req)
	f.Add(false, rep)
	f.Add(true, rep)
	f.Add(false, req)
	f.Add(true, req[:len(req)-1])
	f.Fuzz(func(t *testing.T, isReq bool, data []byte) {
		typ := TypeReconcileReply
		if isReq {
			typ = TypeReconcileRequest
		}
		v, err := (&Envelope{Type: typ, Cbor: data}).Deserialize()
		if err != nil || v == nil {
			t.Fatalf("Deserialize: %v %v", v, err)
		}
		if _, ok := v.(*Undecodable); ok {
			return
		}
		again, err := EnvelopeOf(v)
		if err != nil {
			t.Fatalf("decoded %T does not re-encode: %v", v, err)
		}
		v2, _ := again.Deserialize()
		clear := func(x any) any {
			switch m := x.(type) {
			case *ReconcileRequest:
				c := *m
				c.Size = 0
				return &c
			case *ReconcileReply:
				c := *m
				c.Size = 0
				return &c
			}
			return x
		}
		if !reflect.DeepEqual(clear(v), clear(v2)) {
			t.Fatalf("re-encoding changed the value: %+v vs %+v", v, v2)
		}
	})
}
