package runtime

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/syncmesh/syncmesh/messages/wire"
)

// envelopeSeeds are encodings viewEnvelope reads in place and ones it
// hands to proto.Unmarshal: unknown fields, a varint where a field is
// length-delimited, invalid UTF-8 in the type, repeated fields (the last
// wins), truncations, a group.
func envelopeSeeds(t testing.TB) [][]byte {
	env, err := wire.EnvelopeOf(&wire.Push{Push: testPush("seed", 3, 40)})
	if err != nil {
		t.Fatal(err)
	}
	good, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	field := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	seeds := [][]byte{
		good,
		{},
		good[:len(good)/2],
		good[:1],
		field(field(nil, 2, []byte{0xa0}), 1, []byte(wire.TypeSyncPush)),              // cbor before type
		field(field(good, 1, []byte("other")), 2, []byte{0xf6}),                       // both repeated: the last wins
		field(good, 3, []byte("unknown")),                                             // an unknown field
		protowire.AppendVarint(protowire.AppendTag(good, 2, protowire.VarintType), 7), // cbor as a varint
		field(nil, 1, []byte{0xff, 0xfe}),                                             // invalid UTF-8 type
		field(nil, 2, nil),                                                            // empty cbor
		protowire.AppendTag(nil, 0, protowire.BytesType),                              // field number 0
		protowire.AppendTag(protowire.AppendTag(nil, 5, protowire.StartGroupType), 5, protowire.EndGroupType),
		protowire.AppendTag(nil, 5, protowire.EndGroupType),
		append(protowire.AppendTag(nil, 2, protowire.BytesType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
	}
	return seeds
}

// FuzzViewEnvelope: viewEnvelope accepts exactly what proto.Unmarshal
// accepts as a wire.Envelope and reads the same type and CBOR, so the
// stream guard's verdict is the endpoint reader's.
func FuzzViewEnvelope(f *testing.F) {
	for _, s := range envelopeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := viewEnvelope(data)
		var e wire.Envelope
		perr := proto.Unmarshal(data, &e)
		if (err == nil) != (perr == nil) {
			t.Fatalf("viewEnvelope error %v, proto.Unmarshal error %v", err, perr)
		}
		if err != nil {
			return
		}
		if v.Type != e.Type || !bytes.Equal(v.Cbor, e.Cbor) {
			t.Fatalf("viewEnvelope read (%q, %x), proto.Unmarshal (%q, %x)", v.Type, v.Cbor, e.Type, e.Cbor)
		}
	})
}

// TestViewEnvelopeReadsPushesInPlace: an envelope as syncmesh's senders
// encode it is read without copying its CBOR, in one allocation (the
// type name), and every seed gets protobuf's verdict.
func TestViewEnvelopeReadsPushesInPlace(t *testing.T) {
	env, err := wire.EnvelopeOf(&wire.Push{Push: testPush("p", 500, 200)})
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	v, err := viewEnvelope(data)
	if err != nil {
		t.Fatal(err)
	}
	if v.Type != wire.TypeSyncPush || !bytes.Equal(v.Cbor, env.Cbor) {
		t.Fatalf("read (%q, %d bytes), want (%q, %d bytes)", v.Type, len(v.Cbor), wire.TypeSyncPush, len(env.Cbor))
	}
	if end := len(data) - len(v.Cbor); &v.Cbor[0] != &data[end] {
		t.Fatal("the CBOR was copied, not read in place")
	}
	if n := testing.AllocsPerRun(20, func() { _, _ = viewEnvelope(data) }); n > 1 {
		t.Fatalf("%v allocations per envelope, want at most 1 (the type name)", n)
	}
	for i, s := range envelopeSeeds(t) {
		_, err := viewEnvelope(s)
		perr := proto.Unmarshal(s, &wire.Envelope{})
		if (err == nil) != (perr == nil) {
			t.Errorf("seed %d: viewEnvelope error %v, proto.Unmarshal error %v", i, err, perr)
		}
	}
}
