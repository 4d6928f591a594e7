package messages

import (
	"bytes"
	"errors"
	"testing"
)

func TestEventRoundTrip(t *testing.T) {
	for name, e := range map[string]*Event{
		"upsert":        sampleUpsert(),
		"delete":        sampleDelete(),
		"empty payload": {Site: testSite(3), HLC: 1, Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Payload: Columns{}},
		"max hlc":       {Site: testSite(4), HLC: HLC(^uint64(0)), Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Payload: Columns{"c": Null}},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeEvent(e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeEvent(b)
			if err != nil {
				t.Fatal(err)
			}
			if !eventEqual(got, e) {
				t.Fatalf("got %+v\nwant %+v", got, e)
			}
			b2, err := EncodeEvent(got)
			if err != nil || !bytes.Equal(b, b2) {
				t.Fatalf("re-encoding differs: %v", err)
			}
		})
	}
}

func TestEventEncodingDeterministic(t *testing.T) {
	e := sampleUpsert()
	want, err := EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	// Build the same event many times with maps populated in different
	// orders; Go randomizes map iteration, so encodings must not depend on it.
	names := e.Payload.Names()
	for i := 0; i < 50; i++ {
		p := Columns{}
		for j := range names {
			n := names[(i+j)%len(names)]
			p[n] = e.Payload[n].Clone()
		}
		k := Columns{}
		if i%2 == 0 {
			k["tenant"], k["id"] = MustValue(uint64(3)), MustValue("n1")
		} else {
			k["id"], k["tenant"] = MustValue("n1"), MustValue(uint64(3))
		}
		got, err := EncodeEvent(&Event{Site: e.Site, HLC: e.HLC, Schema: e.Schema, Table: e.Table, Key: k, Payload: p})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("iteration %d: encoding differs (%v)", i, err)
		}
	}
	// Canonical: text keys in length-first order, v first.
	if want[0] != 0xa7 || !bytes.HasPrefix(want[1:], enc(t, "v")) {
		t.Fatalf("not canonical: % x", want[:8])
	}
	if !bytes.Equal(e.RowKey(), e.Key.Encode()) {
		t.Fatal("RowKey is not the key's encoding")
	}
}

func TestDeleteAndEmptyUpsertAreDistinct(t *testing.T) {
	del := &Event{Site: testSite(1), HLC: 5, Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Delete: true}
	ups := &Event{Site: testSite(1), HLC: 5, Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Payload: Columns{}}
	bd, err := EncodeEvent(del)
	if err != nil {
		t.Fatal(err)
	}
	bu, err := EncodeEvent(ups)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(bd, bu) {
		t.Fatal("delete and empty upsert encode the same")
	}
	d, _ := DecodeEvent(bd)
	u, _ := DecodeEvent(bu)
	if !d.Delete || d.Payload != nil {
		t.Fatalf("delete decoded as %+v", d)
	}
	if u.Delete || u.Payload == nil || len(u.Payload) != 0 {
		t.Fatalf("empty upsert decoded as %+v", u)
	}
	// Encode refuses the inconsistent forms.
	if _, err := EncodeEvent(&Event{Site: testSite(1), Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Delete: true, Payload: Columns{}}); err == nil {
		t.Fatal("delete with payload encoded")
	}
	if _, err := EncodeEvent(&Event{Site: testSite(1), Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}}); err == nil {
		t.Fatal("upsert without payload encoded")
	}
}

func TestExplicitNullCellSurvives(t *testing.T) {
	e := &Event{Site: testSite(1), HLC: 5, Schema: "s", Table: "t", Key: Columns{"k": MustValue(1)}, Payload: Columns{"gone": Null, "kept": MustValue("x")}}
	b, err := EncodeEvent(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	v, ok := got.Payload["gone"]
	if !ok || !v.IsNull() {
		t.Fatalf("null cell lost: %v %v", v, ok)
	}
	if got.Payload["kept"].IsNull() {
		t.Fatal("non-null cell reads as null")
	}
	if _, ok := got.Payload["never"]; ok {
		t.Fatal("unwritten column present")
	}
	x, err := v.Interface()
	if err != nil || x != nil {
		t.Fatalf("null Interface = %v, %v", x, err)
	}
}

func TestDecodeEventRejects(t *testing.T) {
	type mod func(m map[string]any)
	site := testSite(1)
	cases := []struct {
		name string
		mod  mod
		kind error // besides ErrMalformed
	}{
		{"version 2", func(m map[string]any) { m["v"] = 2 }, ErrUnsupportedVersion},
		{"version 0", func(m map[string]any) { m["v"] = 0 }, ErrUnsupportedVersion},
		{"version missing", func(m map[string]any) { delete(m, "v") }, ErrUnsupportedVersion},
		{"version as text", func(m map[string]any) { m["v"] = "1" }, nil},
		{"hlc as text", func(m map[string]any) { m["hlc"] = "12345" }, nil},
		{"hlc negative", func(m map[string]any) { m["hlc"] = -1 }, nil},
		{"hlc missing", func(m map[string]any) { delete(m, "hlc") }, nil},
		{"hlc null", func(m map[string]any) { m["hlc"] = nil }, nil},
		{"site 15 bytes", func(m map[string]any) { m["site"] = site[:15] }, nil},
		{"site 17 bytes", func(m map[string]any) { m["site"] = append(site[:], 0) }, nil},
		{"site missing", func(m map[string]any) { delete(m, "site") }, nil},
		{"site as text", func(m map[string]any) { m["site"] = string(site[:]) }, nil},
		{"site as array", func(m map[string]any) {
			a := make([]any, 16)
			for i := range a {
				a[i] = i
			}
			m["site"] = a
		}, nil},
		{"schema as int", func(m map[string]any) { m["schema"] = 7 }, nil},
		{"schema as bytes", func(m map[string]any) { m["schema"] = []byte("app") }, nil},
		{"schema empty", func(m map[string]any) { m["schema"] = "" }, nil},
		{"table missing", func(m map[string]any) { delete(m, "table") }, nil},
		{"table too long", func(m map[string]any) { m["table"] = string(bytes.Repeat([]byte("t"), 256)) }, nil},
		{"key missing", func(m map[string]any) { delete(m, "key") }, nil},
		{"payload missing", func(m map[string]any) { delete(m, "payload") }, nil},
		{"key as array", func(m map[string]any) { m["key"] = []any{"id", "n1"} }, nil},
		{"key with int column name", func(m map[string]any) { m["key"] = map[int]any{1: "n1"} }, nil},
		{"payload as text", func(m map[string]any) { m["payload"] = "x" }, nil},
		{"payload empty column name", func(m map[string]any) { m["payload"] = map[string]any{"": 1} }, nil},
		{"unknown field", func(m map[string]any) { m["extra"] = 1 }, nil},
		{"null key", func(m map[string]any) { m["key"] = nil }, ErrEmptyRowKey},
		{"empty key", func(m map[string]any) { m["key"] = map[string]any{} }, ErrEmptyRowKey},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := wireMap(t)
			c.mod(m)
			e, err := DecodeEvent(enc(t, m))
			if err == nil {
				t.Fatalf("accepted: %+v", e)
			}
			if e != nil {
				t.Fatal("event returned with error")
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err %v does not match ErrMalformed", err)
			}
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Fatalf("err %v does not match %v", err, c.kind)
			}
			if c.kind != ErrEmptyRowKey && errors.Is(err, ErrEmptyRowKey) {
				t.Fatalf("err %v wrongly matches ErrEmptyRowKey", err)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err %T is not a *DecodeError", err)
			}
		})
	}
	// The base map itself is valid, so each case fails for its own reason.
	if _, err := DecodeEvent(enc(t, wireMap(t))); err != nil {
		t.Fatalf("base wire map rejected: %v", err)
	}
}

func TestDecodeEventRejectsRawEncodings(t *testing.T) {
	valid, err := EncodeEvent(sampleDelete())
	if err != nil {
		t.Fatal(err)
	}
	// Build a minimal event by hand so single items can be swapped.
	site := testSite(1)
	head := func(n byte) []byte { return []byte{0xa0 | n} }
	field := func(k string, v []byte) []byte { return append(enc(t, k), v...) }
	build := func(extra ...[]byte) []byte {
		fields := [][]byte{
			field("v", []byte{0x01}),
			field("hlc", []byte{0x05}),
			field("key", enc(t, map[string]any{"id": 1})),
			field("site", enc(t, site[:])),
			field("table", enc(t, "t")),
			field("schema", enc(t, "s")),
			field("payload", []byte{0xf6}),
		}
		fields = append(fields, extra...)
		out := head(byte(len(fields)))
		for _, f := range fields {
			out = append(out, f...)
		}
		return out
	}
	if _, err := DecodeEvent(build()); err != nil {
		t.Fatalf("hand-built event rejected: %v", err)
	}
	cases := []struct {
		name string
		raw  []byte
		kind error
	}{
		{"trailing byte", append(bytes.Clone(valid), 0x00), ErrTrailingBytes},
		{"trailing item", append(bytes.Clone(valid), valid...), ErrTrailingBytes},
		{"duplicate top-level key", build(field("v", []byte{0x01})), nil},
		{"duplicate column", func() []byte {
			// key map {"id": 1, "id": 2}
			k := append([]byte{0xa2}, enc(t, "id")...)
			k = append(k, 0x01)
			k = append(k, enc(t, "id")...)
			k = append(k, 0x02)
			b := build()
			return bytes.Replace(b, enc(t, map[string]any{"id": 1}), k, 1)
		}(), nil},
		{"indefinite-length map", append([]byte{0xbf}, append(build()[1:], 0xff)...), nil},
		{"indefinite-length text", bytes.Replace(build(), enc(t, "s"), []byte{0x7f, 0x61, 's', 0xff}, 1), nil},
		{"tag on hlc", bytes.Replace(build(), field("hlc", []byte{0x05}), field("hlc", []byte{0xc1, 0x05}), 1), nil},
		{"tag inside a value", bytes.Replace(build(), enc(t, map[string]any{"id": 1}), []byte{0xa1, 0x62, 'i', 'd', 0xc1, 0x01}, 1), nil},
		{"invalid utf-8 schema", bytes.Replace(build(), enc(t, "s"), []byte{0x61, 0xff}, 1), nil},
		{"truncated", valid[:len(valid)-1], nil},
		{"empty", nil, nil},
		{"not a map", []byte{0x80}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeEvent(c.raw)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Fatalf("err = %v, want %v", err, c.kind)
			}
		})
	}
}

func TestDecodeEventTooLarge(t *testing.T) {
	big := make([]byte, MaxEventSize+1)
	_, err := DecodeEvent(big)
	if !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("err = %v", err)
	}
	// Encode refuses to produce an event the decoder would refuse.
	e := sampleUpsert()
	e.Payload = Columns{"big": MustValue(bytes.Repeat([]byte{1}, MaxEventSize))}
	if _, err := EncodeEvent(e); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("encode oversize: %v", err)
	}
}

func TestEncodeEventValidates(t *testing.T) {
	base := func() *Event { return sampleUpsert() }
	cases := map[string]func(e *Event){
		"null key":          func(e *Event) { e.Key = nil },
		"empty key":         func(e *Event) { e.Key = Columns{} },
		"empty schema":      func(e *Event) { e.Schema = "" },
		"empty column name": func(e *Event) { e.Payload[""] = Null },
		"malformed value":   func(e *Event) { e.Payload["bad"] = Value{0x18} },
		"empty value":       func(e *Event) { e.Payload["bad"] = Value{} },
	}
	for name, m := range cases {
		e := base()
		m(e)
		if _, err := EncodeEvent(e); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	e := base()
	e.Key = nil
	if _, err := EncodeEvent(e); !errors.Is(err, ErrEmptyRowKey) {
		t.Errorf("null key: err = %v, want ErrEmptyRowKey", err)
	}
}
