package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/messages"
)

// Every Go integer type, an integral float64 (a key decoded from JSON) and
// a json.Number name the same row as int 1.
func TestTypedKeysNameTheSameRow(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": "x"}); err != nil {
		t.Fatal(err)
	}
	type myID uint16
	var fromJSON map[string]any
	if err := json.Unmarshal([]byte(`{"id": 1}`), &fromJSON); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{int8(1), int16(1), int32(1), int64(1), uint(1), uint8(1), uint32(1), uint64(1), uintptr(1), float32(1), fromJSON["id"], json.Number("1"), myID(1)} {
		r, ok, err := n.Get(n.ctx, "app", "t", map[string]any{"id": v})
		if err != nil || !ok {
			t.Fatalf("Get with %T(%v): ok=%v err=%v", v, v, ok, err)
		}
		var a string
		if _, err := r.Value("a", &a); err != nil || a != "x" {
			t.Fatalf("Get with %T: a=%q err=%v", v, a, err)
		}
	}
	// A write keyed by float64(1) updates that row: no second row.
	if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": fromJSON["id"]}, map[string]any{"a": "y"}); err != nil {
		t.Fatal(err)
	}
	rows := 0
	if err := n.Scan(n.ctx, "app", "t", ScanOptions{}, func(Row) bool { rows++; return true }); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d rows, want 1", rows)
	}
	// Negative and large values keep their integer identity.
	for _, pair := range [][2]any{{-5, float64(-5)}, {uint64(math.MaxUint64), json.Number("18446744073709551615")}, {int64(1 << 60), float64(1 << 60)}} {
		a, err := encodeKey(map[string]any{"id": pair[0]})
		if err != nil {
			t.Fatal(err)
		}
		b, err := encodeKey(map[string]any{"id": pair[1]})
		if err != nil {
			t.Fatal(err)
		}
		if string(a.Encode()) != string(b.Encode()) {
			t.Fatalf("%T(%v) and %T(%v) encode differently", pair[0], pair[0], pair[1], pair[1])
		}
	}
}

// nil, empty and non-integral components are refused with a typed error on
// local writes and lookups, and nothing is written.
func TestInvalidKeyComponentsRefused(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id", "part"}, Columns: []string{"a"}})
	var nilPtr *int
	cases := map[string]any{
		"nil": nil, "empty string": "", "empty bytes": []byte{}, "nil pointer": nilPtr,
		"fraction": 1.5, "NaN": math.NaN(), "Inf": math.Inf(1), "too large": 1e30,
		"null value": messages.Null, "struct": struct{}{}, "slice": []int{1}, "bad number": json.Number("x"),
	}
	for name, v := range cases {
		key := map[string]any{"id": 1, "part": v}
		_, err := n.Upsert(n.ctx, "app", "t", key, map[string]any{"a": 1})
		var ke *KeyError
		if !errors.Is(err, ErrInvalidKey) || !errors.As(err, &ke) || ke.Column != "part" {
			t.Errorf("Upsert with %s: %v", name, err)
		}
		if _, err := n.Delete(n.ctx, "app", "t", key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Delete with %s: %v", name, err)
		}
		if _, _, err := n.Get(n.ctx, "app", "t", key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Get with %s: %v", name, err)
		}
	}
	if _, err := n.Upsert(n.ctx, "app", "t", nil, map[string]any{"a": 1}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("nil key map: %v", err)
	}
	if seq, err := n.LastSeq(n.ctx); err != nil || seq != 0 {
		t.Fatalf("refused writes left %d events (%v)", seq, err)
	}
}

// A received signed event whose key value is not in its one canonical
// encoding is dropped as malformed: every encoding of the integer 1 a peer
// can sign — longer integer heads, floats of each width naming 1 — lands
// in the one row that Get and Delete of id 1 reach, or nowhere.
func TestReceivedNonCanonicalKeysAreDropped(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	p := newPeer(t, 7)
	n.trust(p)
	encodings := [][]byte{
		{0x01},
		{0x18, 0x01},
		{0x19, 0x00, 0x01},
		{0x1a, 0x00, 0x00, 0x00, 0x01},
		{0x1b, 0, 0, 0, 0, 0, 0, 0, 0x01},
		{0xf9, 0x3c, 0x00},
		{0xfa, 0x3f, 0x80, 0x00, 0x00},
		{0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0},
		// Other values, as non-canonical: -1 with a long head, and -0.0.
		{0x38, 0x00},
		{0xf9, 0x80, 0x00},
	}
	site := p.signer.Site()
	for i, enc := range encodings {
		raw := p.rawEvent(map[string]any{
			"v": 1, "hlc": uint64(hlcAt(n.wall.MS(), uint16(i+1))), "site": site[:],
			"schema": "app", "table": "t",
			"key":     cbor.RawMessage(append([]byte{0xa1, 0x62, 'i', 'd'}, enc...)),
			"payload": map[string]any{"a": fmt.Sprintf("v%d", i)},
		})
		out := n.apply(raw)
		want := messages.Dropped
		if i == 0 {
			want = messages.Applied
		}
		if out.Kind != want || (i > 0 && out.Reason != messages.ReasonMalformed) {
			t.Errorf("key encoding %x: outcome %v, want %v", enc, out, want)
		}
	}
	rows := 0
	if err := n.Scan(n.ctx, "app", "t", ScanOptions{}, func(Row) bool { rows++; return true }); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d rows for key 1, want 1", rows)
	}
	if _, err := n.Delete(n.ctx, "app", "t", map[string]any{"id": 1}); err != nil {
		t.Fatal(err)
	}
	rows = 0
	if err := n.Scan(n.ctx, "app", "t", ScanOptions{}, func(Row) bool { rows++; return true }); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d rows left after deleting id 1", rows)
	}
	// The local API holds an encoded key value to the same rule.
	for _, enc := range encodings[1:] {
		_, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": messages.Value(enc)}, map[string]any{"a": "x"})
		if !errors.Is(err, ErrInvalidKey) {
			t.Errorf("local write keyed by %x: %v", enc, err)
		}
	}
}
