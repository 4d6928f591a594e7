package runtime

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

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

// A received signed event's key is used exactly as signed: a float key
// from a peer names its own row, not the integer one.
func TestReceivedKeysStayAsSigned(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	p := newPeer(t, 7)
	n.trust(p)
	raw := p.event(&messages.Event{HLC: hlcAt(n.wall.MS(), 1), Schema: "app", Table: "t",
		Key: messages.Columns{"id": messages.MustValue(2.0)}, Payload: messages.Columns{"a": messages.MustValue("float")}})
	if out := n.apply(raw); out.Kind != messages.Applied {
		t.Fatalf("outcome %v", out)
	}
	if _, ok, err := n.Get(n.ctx, "app", "t", map[string]any{"id": 2}); err != nil || ok {
		t.Fatalf("the float-keyed row was normalized into the integer row: ok=%v err=%v", ok, err)
	}
	if _, ok, err := n.Get(n.ctx, "app", "t", map[string]any{"id": messages.MustValue(2.0)}); err != nil || !ok {
		t.Fatalf("the row as signed: ok=%v err=%v", ok, err)
	}
}
