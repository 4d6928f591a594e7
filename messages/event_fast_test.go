package messages

import (
	"bytes"
	"strings"
	"testing"
)

// canonicalSamples are events the fast path must take.
func canonicalSamples(t testing.TB) [][]byte {
	evs := []*Event{sampleDelete(),
		{Site: SiteID{1}, HLC: 1 << 40, Schema: "s", Table: "t", Key: Columns{"id": MustValue(-70000)}, Payload: Columns{}},
		{Site: SiteID{2}, HLC: 5, Schema: "s", Table: "t", Key: Columns{"a": MustValue("x"), "bb": MustValue([]byte{1, 2})},
			Payload: Columns{"f": MustValue(1.5), "g": MustValue(true), "h": Null, "i": MustValue(uint64(1) << 63), "é": MustValue("ü")}},
	}
	var out [][]byte
	for _, e := range evs {
		b, err := EncodeEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestDecodeEventCanonicalFastPath: EncodeEvent's output takes the fast
// path and decodes exactly as the strict decoder decodes it.
func TestDecodeEventCanonicalFastPath(t *testing.T) {
	for i, b := range canonicalSamples(t) {
		fast, rowKey, ok := decodeEventCanonical(b)
		if !ok {
			t.Fatalf("sample %d: canonical event left the fast path", i)
		}
		if !bytes.Equal(rowKey, fast.RowKey()) {
			t.Fatalf("sample %d: the fast path's row key %x, RowKey %x", i, rowKey, fast.RowKey())
		}
		strict, err := decodeEventStrict(b)
		if err != nil {
			t.Fatalf("sample %d: strict: %v", i, err)
		}
		if !eventEqual(fast, strict) || fast.Delete != strict.Delete || (fast.Payload == nil) != (strict.Payload == nil) {
			t.Fatalf("sample %d: fast %+v, strict %+v", i, fast, strict)
		}
		// The event owns its bytes: scribbling over the input changes nothing.
		in := bytes.Clone(b)
		e, _ := DecodeEvent(in)
		for j := range in {
			in[j] = 0
		}
		if !eventEqual(e, strict) {
			t.Fatalf("sample %d: decoded event aliases its input", i)
		}
	}
}

// TestDecodeEventCanonicalLeavesOthers: inputs off the canonical shape are
// left to the strict decoder (which accepts or rejects them itself).
func TestDecodeEventCanonicalLeavesOthers(t *testing.T) {
	b := canonicalSamples(t)[0]
	nonShortest := append([]byte{0xb8, 0x07}, b[1:]...) // map head with a 1-byte argument
	if _, _, ok := decodeEventCanonical(nonShortest); ok {
		t.Fatal("non-shortest map head took the fast path")
	}
	if _, err := DecodeEvent(nonShortest); err != nil {
		t.Fatalf("strict decoder refused a non-shortest head: %v", err)
	}
	for _, in := range [][]byte{b[:len(b)-1], append(bytes.Clone(b), 0), {0xa0}, nil} {
		if _, _, ok := decodeEventCanonical(in); ok {
			t.Fatalf("%x took the fast path", in)
		}
	}
	m := wireMap(t)
	m["key"] = map[string]any{}
	if _, _, ok := decodeEventCanonical(enc(t, m)); ok {
		t.Fatal("empty key took the fast path")
	}
	m = wireMap(t)
	m["payload"] = map[string]any{"nested": []any{1, 2}}
	if _, _, ok := decodeEventCanonical(enc(t, m)); ok {
		t.Fatal("a nested value took the fast path")
	}
	if _, err := DecodeEvent(enc(t, m)); err != nil {
		t.Fatalf("strict decoder refused a nested value: %v", err)
	}
}

// FuzzDecodeEventCanonical: whatever the fast path accepts, the strict
// decoder accepts too, with an equal event.
func FuzzDecodeEventCanonical(f *testing.F) {
	for _, b := range canonicalSamples(f) {
		f.Add(b)
		f.Add(b[:len(b)-2])
	}
	f.Add([]byte{0xa7})
	up, _ := EncodeEvent(sampleUpsert())
	f.Add(up)
	f.Fuzz(func(t *testing.T, in []byte) {
		checkOwnedAgrees(t, in)
		fast, rowKey, ok := decodeEventCanonical(in)
		if !ok {
			return
		}
		if !bytes.Equal(rowKey, fast.RowKey()) {
			t.Fatalf("fast path's row key %x, RowKey %x", rowKey, fast.RowKey())
		}
		strict, err := decodeEventStrict(in)
		if err != nil {
			t.Fatalf("fast path accepted what the strict decoder refuses: %v", err)
		}
		if !eventEqual(fast, strict) || fast.Delete != strict.Delete || (fast.Payload == nil) != (strict.Payload == nil) {
			t.Fatalf("fast %+v, strict %+v", fast, strict)
		}
		if b, err := EncodeEvent(fast); err != nil || !bytes.Equal(b, in) {
			t.Fatalf("fast path accepted a non-canonical encoding (%v)", err)
		}
	})
}

// checkOwnedAgrees holds DecodeEventOwned to DecodeEventRowKey on in: the
// same verdict, an equal event and row key, *e untouched on an error.
func checkOwnedAgrees(t *testing.T, in []byte) {
	t.Helper()
	want, wantKey, wantErr := DecodeEventRowKey(in)
	sentinel := Event{Schema: "untouched"}
	got := sentinel
	gotKey, err := DecodeEventOwned(&got, bytes.Clone(in))
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("owned decode error %v, DecodeEventRowKey %v", err, wantErr)
	case err != nil:
		if !eventEqual(&got, &sentinel) {
			t.Fatalf("a failed owned decode wrote the event: %+v", got)
		}
	case !eventEqual(&got, want) || !bytes.Equal(gotKey, wantKey) || (gotKey == nil) != (wantKey == nil):
		t.Fatalf("owned decode %+v key %x, DecodeEventRowKey %+v key %x", got, gotKey, want, wantKey)
	}
}

// TestDecodeEventOwnedSharesItsInput: an owned decode agrees with
// DecodeEventRowKey on canonical samples, non-canonical ones (the strict
// decoder's) and bad ones; a canonical event's names, values and row key
// are the input's own bytes (no copy), which is why the caller must not
// modify them.
func TestDecodeEventOwnedSharesItsInput(t *testing.T) {
	samples := canonicalSamples(t)
	nonShortest := append([]byte{0xb8, 0x07}, samples[0][1:]...)
	for _, in := range append(samples, nonShortest, samples[1][:len(samples[1])-1], nil) {
		checkOwnedAgrees(t, in)
	}
	in := bytes.Clone(samples[2])
	var e Event
	rowKey, err := DecodeEventOwned(&e, in)
	if err != nil {
		t.Fatal(err)
	}
	table, a, f, key := strings.Clone(e.Table), bytes.Clone(e.Key["a"]), bytes.Clone(e.Payload["f"]), bytes.Clone(rowKey)
	for i := range in {
		in[i] = 0
	}
	if e.Table == table || bytes.Equal(e.Key["a"], a) || bytes.Equal(e.Payload["f"], f) || bytes.Equal(rowKey, key) {
		t.Fatal("an owned decode copied its input")
	}
}

// FuzzDecodeColumnsCanonical: whatever DecodeColumns' hand reader accepts,
// the strict decoder accepts too, with equal columns.
func FuzzDecodeColumnsCanonical(f *testing.F) {
	f.Add(Columns{"a": MustValue(1), "bb": Null, "c": MustValue("x")}.Encode())
	f.Add(Columns{"id": MustValue([]any{1})}.Encode())
	f.Add([]byte{0xa2, 0x61, 'b', 0x01, 0x61, 'a', 0x02})
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := canonReader{b: in}
		fast := r.columns()
		if r.bad || len(r.b) != 0 {
			return
		}
		strict, err := decodeColumnsStrict(in)
		if err != nil || !columnsEqual(fast, strict) {
			t.Fatalf("hand reader %v, strict %v (%v)", fast, strict, err)
		}
		if !bytes.Equal(fast.Encode(), in) {
			t.Fatal("hand reader accepted a non-canonical encoding")
		}
	})
}

// Encode and AppendEncode write the same bytes, past the stack-sorted size.
func TestAppendEncode(t *testing.T) {
	c := Columns{}
	for i := 0; i < 12; i++ {
		c[string(rune('a'+i))+string(make([]byte, i%3))] = MustValue(i)
		want := c.Encode()
		got := c.AppendEncode([]byte("prefix"))
		if string(got) != "prefix"+string(want) {
			t.Fatalf("%d columns: AppendEncode %x, Encode %x", len(c), got, want)
		}
		back, err := DecodeColumns(want)
		if err != nil || !columnsEqual(back, c) {
			t.Fatalf("%d columns: round trip %v", len(c), err)
		}
	}
}

// BenchmarkDecodeEvent compares the canonical fast path with the strict
// reflective decoder on a typical event.
func BenchmarkDecodeEvent(b *testing.B) {
	in, err := EncodeEvent(&Event{Site: SiteID{1}, HLC: 1 << 40, Schema: "bench", Table: "t",
		Key: Columns{"id": MustValue(4711)}, Payload: Columns{"a": MustValue("value-4711"), "b": MustValue(4711)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := DecodeEvent(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := decodeEventStrict(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
