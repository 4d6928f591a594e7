package wire

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/messages"
)

func samplePush() *messages.SyncPush {
	return &messages.SyncPush{
		V: messages.SyncVersion, From: "node-a", Log: bytes.Repeat([]byte{7}, 16),
		After: 10, Through: 20, Tail: 40,
		Events: []messages.PushedEvent{{Seq: 3, Raw: []byte{1, 2}}, {Seq: 11, Raw: []byte{3}}, {Seq: 20, Raw: []byte{4}}},
		Claims: []messages.WatermarkClaim{{Group: messages.Group{Site: messages.SiteID{1}, Schema: "s", Table: "t"}, HLC: 99, Seq: 18}},
	}
}

func sampleResult() *messages.PushResult {
	return &messages.PushResult{
		V: messages.SyncVersion, Applied: 2, Retry: []uint64{11}, Rejected: 1,
		Held:       []messages.Group{{Site: messages.SiteID{2}, Schema: "s", Table: "u"}},
		Watermarks: []messages.GroupWatermark{{Group: messages.Group{Site: messages.SiteID{1}, Schema: "s", Table: "t"}, HLC: 77}},
	}
}

// roundTrip serializes m, marshals the envelope as protoactor's endpoint
// writer does, unmarshals it as the endpoint reader does and deserializes.
func roundTrip(t *testing.T, m remote.RootSerializable) remote.RootSerializable {
	t.Helper()
	env, err := EnvelopeOf(m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	var got Envelope
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	v, err := got.Deserialize()
	if err != nil {
		t.Fatalf("Deserialize returned an error: %v", err)
	}
	return v
}

func TestPushRoundTrip(t *testing.T) {
	p := samplePush()
	v := roundTrip(t, &Push{Push: p})
	got, ok := v.(*Push)
	if !ok {
		t.Fatalf("decoded %T (%v)", v, v)
	}
	want, _ := messages.EncodeSyncPush(p)
	if got.Size != len(want) || !reflect.DeepEqual(got.Push, p) {
		t.Fatalf("round trip changed the push: %+v (size %d, want %d)", got.Push, got.Size, len(want))
	}
}

func TestResultRoundTrip(t *testing.T) {
	r := sampleResult()
	v := roundTrip(t, &Result{Result: r})
	got, ok := v.(*Result)
	if !ok || !reflect.DeepEqual(got.Result, r) || got.Size == 0 {
		t.Fatalf("decoded %T %+v", v, v)
	}
}

func TestRejectedRoundTrip(t *testing.T) {
	v := roundTrip(t, &Rejected{Reason: "no receiver"})
	got, ok := v.(*Rejected)
	if !ok || got.Reason != "no receiver" || got.Size == 0 {
		t.Fatalf("decoded %T %+v", v, v)
	}
	long := &Rejected{Reason: strings.Repeat("x", 5000)}
	v = roundTrip(t, long)
	if got, ok := v.(*Rejected); !ok || len(got.Reason) != MaxRejectedReason {
		t.Fatalf("long reason: %T %+v", v, v)
	}
	v = roundTrip(t, &Rejected{Reason: "bad \xff utf8"})
	if got, ok := v.(*Rejected); !ok || !strings.Contains(got.Reason, `\xff`) {
		t.Fatalf("invalid utf-8 reason: %T %+v", v, v)
	}
}

func TestSerializeRejectsInvalidMessages(t *testing.T) {
	bad := samplePush()
	bad.V = 9
	if _, err := EnvelopeOf(&Push{Push: bad}); !errors.Is(err, messages.ErrUnsupportedVersion) {
		t.Fatalf("invalid push: %v", err)
	}
	if _, err := EnvelopeOf(&Push{}); !errors.Is(err, ErrNilMessage) {
		t.Fatalf("nil push: %v", err)
	}
	if _, err := EnvelopeOf(&Result{}); !errors.Is(err, ErrNilMessage) {
		t.Fatalf("nil result: %v", err)
	}
	if _, err := EnvelopeOf(nil); !errors.Is(err, ErrNilMessage) {
		t.Fatalf("nil: %v", err)
	}
	if _, err := EnvelopeOf(&Undecodable{}); !errors.Is(err, ErrNotSendable) {
		t.Fatalf("undecodable: %v", err)
	}
}

func TestDeserializeSurfacesBadFrames(t *testing.T) {
	valid, _ := messages.EncodeSyncPush(samplePush())
	invalid := samplePush()
	invalid.Events[0].Seq = 15 // out of order
	invalidRaw, _ := messages.Marshal(invalid)
	tooMany := samplePush()
	tooMany.Through, tooMany.Tail = 5000, 5000
	tooMany.Events = nil
	for i := uint64(1); i <= messages.MaxPushEvents+1; i++ {
		tooMany.Events = append(tooMany.Events, messages.PushedEvent{Seq: i, Raw: []byte{1}})
	}
	tooManyRaw, _ := messages.Marshal(tooMany)
	cases := []struct {
		name  string
		env   *Envelope
		known bool
		want  error
	}{
		{"nil", nil, false, ErrNilMessage},
		{"unknown type", &Envelope{Type: "no.such.type", Cbor: valid}, false, ErrUnknownType},
		{"empty type", &Envelope{Cbor: valid}, false, ErrUnknownType},
		{"garbage cbor", &Envelope{Type: TypeSyncPush, Cbor: []byte{0xff, 0x00, 0x13}}, true, messages.ErrMalformed},
		{"empty cbor", &Envelope{Type: TypeSyncPush}, true, messages.ErrMalformed},
		{"trailing bytes", &Envelope{Type: TypeSyncPush, Cbor: append(append([]byte{}, valid...), 0)}, true, messages.ErrTrailingBytes},
		{"invalid push", &Envelope{Type: TypeSyncPush, Cbor: invalidRaw}, true, messages.ErrSyncInvalid},
		{"too many events", &Envelope{Type: TypeSyncPush, Cbor: tooManyRaw}, true, messages.ErrMalformed},
		{"push as result", &Envelope{Type: TypePushResult, Cbor: valid}, true, messages.ErrMalformed},
		{"oversize", &Envelope{Type: TypeSyncPush, Cbor: make([]byte, messages.MaxPushBytes+1)}, true, messages.ErrTooLarge},
		{"long rejected", &Envelope{Type: TypeRejected, Cbor: make([]byte, 4096)}, true, messages.ErrTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := c.env.Deserialize()
			if err != nil {
				t.Fatalf("Deserialize returned an error: %v", err)
			}
			u, ok := v.(*Undecodable)
			if !ok {
				t.Fatalf("decoded %T", v)
			}
			if !errors.Is(u, c.want) || u.Known != c.known || u.Size != len(c.env.GetCbor()) || u.Type != c.env.GetType() {
				t.Fatalf("undecodable %+v (%v), want kind %v known %v", u, u, c.want, c.known)
			}
		})
	}
}

func TestDeserializeTruncatesLongTypeNames(t *testing.T) {
	v, _ := (&Envelope{Type: strings.Repeat("é", 200)}).Deserialize()
	u := v.(*Undecodable)
	if len(u.Type) > MaxTypeName || !strings.HasPrefix(strings.Repeat("é", 200), u.Type) {
		t.Fatalf("type name %q", u.Type)
	}
}

type panicky struct{}

func (panicky) Serialize() (remote.RootSerialized, error) {
	return &Envelope{Type: "test.panicky"}, nil
}

type nilDecoded struct{}

func (*nilDecoded) Serialize() (remote.RootSerialized, error) {
	return &Envelope{Type: "test.nil"}, nil
}

var registerRun int

func TestRegister(t *testing.T) {
	if err := Register(TypeSyncPush, decodePush); !errors.Is(err, ErrDuplicateType) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := Register("", decodePush); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("empty name: %v", err)
	}
	if err := Register(strings.Repeat("n", MaxTypeName+1), decodePush); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("long name: %v", err)
	}
	if err := Register[*Push]("test.nil-decoder", nil); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("nil decoder: %v", err)
	}
	// The registry is process-wide: fresh names on every run (-count=N).
	registerRun++
	panickyName, nilName := fmt.Sprintf("test.panicky.%d", registerRun), fmt.Sprintf("test.nil.%d", registerRun)
	if err := Register(panickyName, func([]byte) (panicky, error) { panic("boom") }); err != nil {
		t.Fatal(err)
	}
	if !Registered(panickyName) || Registered("test.absent") {
		t.Fatal("Registered is wrong")
	}
	v, err := (&Envelope{Type: panickyName, Cbor: []byte{1}}).Deserialize()
	if u, ok := v.(*Undecodable); err != nil || !ok || !errors.Is(u, ErrDecoderPanic) || !u.Known {
		t.Fatalf("panicking decoder: %T %v %v", v, v, err)
	}
	if err := Register(nilName, func([]byte) (*nilDecoded, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	v, err = (&Envelope{Type: nilName}).Deserialize()
	if u, ok := v.(*Undecodable); err != nil || !ok || !errors.Is(u, ErrNilMessage) {
		t.Fatalf("nil-returning decoder: %T %v %v", v, v, err)
	}
}

// FuzzEnvelopeDeserialize: Deserialize never panics nor errs; what decodes
// is the registered type of its name and re-encodes to something that
// decodes to the same value.
func FuzzEnvelopeDeserialize(f *testing.F) {
	push, _ := messages.EncodeSyncPush(samplePush())
	res, _ := messages.EncodePushResult(sampleResult())
	rej, _ := messages.Marshal(&Rejected{Reason: "x"})
	f.Add(TypeSyncPush, push)
	f.Add(TypePushResult, res)
	f.Add(TypeRejected, rej)
	f.Add(TypeSyncPush, res)
	f.Add(TypePushResult, push)
	f.Add(TypeSyncPush, push[:len(push)/2])
	f.Add(TypeSyncPush, []byte{0xbf, 0xff})
	f.Add("unknown", push)
	f.Add("", []byte{})
	dev, _ := messages.Marshal(&DeviceEnvelope{From: messages.DeviceAddress{User: "a", Device: 1}, To: messages.DeviceAddress{User: "b", Device: 2}, Envelope: []byte{1}})
	breq, _ := messages.Marshal(&BundleRequest{To: messages.DeviceAddress{User: "b", Device: 2}})
	f.Add(TypeDeviceEnvelope, dev)
	f.Add(TypeBundleRequest, breq)
	f.Add(TypeBundle, []byte{0x83, 0x01, 0x02, 0x03})
	f.Fuzz(func(t *testing.T, typ string, data []byte) {
		env := &Envelope{Type: typ, Cbor: data}
		v, err := env.Deserialize()
		if err != nil || v == nil {
			t.Fatalf("Deserialize: %v %v", v, err)
		}
		if u, ok := v.(*Undecodable); ok {
			if u.Err == nil || u.Size != len(data) || len(u.Type) > MaxTypeName {
				t.Fatalf("bad undecodable %+v", u)
			}
			return
		}
		again, err := EnvelopeOf(v)
		if err != nil {
			t.Fatalf("decoded %T does not re-encode: %v", v, err)
		}
		if again.Type != typ {
			t.Fatalf("type %q decoded to %q", typ, again.Type)
		}
		v2, _ := again.Deserialize()
		clear := func(x remote.RootSerializable) remote.RootSerializable {
			switch m := x.(type) {
			case *Push:
				return &Push{Push: m.Push}
			case *Result:
				return &Result{Result: m.Result}
			case *Rejected:
				return &Rejected{Reason: m.Reason}
			}
			return x
		}
		if !reflect.DeepEqual(clear(v), clear(v2)) {
			t.Fatalf("re-encoding changed the value: %+v vs %+v", v, v2)
		}
	})
}

func TestDeviceTypesRoundTripAndRejectBadInput(t *testing.T) {
	from, to := messages.DeviceAddress{User: "a", Device: 1}, messages.DeviceAddress{User: "b", Device: 2}
	env, err := EnvelopeOf(&DeviceEnvelope{From: from, To: to, Envelope: []byte{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := env.Deserialize()
	de, ok := got.(*DeviceEnvelope)
	if !ok || de.From != from || de.To != to || string(de.Envelope) != "\x01\x02\x03" {
		t.Fatalf("round trip: %#v", got)
	}
	if _, err := EnvelopeOf(&DeviceEnvelope{From: from, To: to}); err == nil {
		t.Fatal("empty envelope serialized")
	}
	env, err = EnvelopeOf(&BundleRequest{To: to})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := env.Deserialize(); got.(*BundleRequest).To != to {
		t.Fatalf("bundle request: %#v", got)
	}
	bad := &Envelope{Type: TypeDeviceEnvelope, Cbor: []byte{0x83, 0x60, 0x60, 0x40}}
	if got, _ := bad.Deserialize(); func() bool { _, ok := got.(*Undecodable); return !ok }() {
		t.Fatalf("malformed device envelope decoded: %#v", got)
	}
}
