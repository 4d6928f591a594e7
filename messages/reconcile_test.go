package messages

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func rkey(site byte, h HLC, id byte) ReconcileKey {
	var e EventID
	for i := range e {
		e[i] = id + byte(i)
	}
	return NewReconcileKey(testSite(site), h, e)
}

// bnd returns the first n bytes of k (a range bound).
func bnd(k ReconcileKey, n int) []byte { return bytes.Clone(k[:n]) }

func sampleReconcile() *Reconcile {
	return &Reconcile{Groups: []ReconcileGroup{
		{Schema: "app", Table: "a", Bound: 5, Ranges: []ReconcileRange{
			{Mode: RangeSkip, Upper: bnd(rkey(1, 10, 0), 18)},
			{Mode: RangeFingerprint, Upper: bnd(rkey(1, 20, 0), 20), FP: [FingerprintSize]byte{1, 2, 3}},
			{Mode: RangeIDList, Upper: bnd(rkey(2, 0, 0), 1), Keys: []ReconcileKey{rkey(1, 30, 1), rkey(1, 31, 2)}},
			{Mode: RangeIDReply, Keys: []ReconcileKey{rkey(3, 1, 9)}, Need: []byte{0x01}},
		}},
		{Schema: "app", Table: "b", Ranges: []ReconcileRange{{Mode: RangeFingerprint, FP: [FingerprintSize]byte{9}}}},
	}}
}

// sampleSum is a version-2 round: one group described by its range sum
// beside one described by fingerprints.
func sampleSum() *Reconcile {
	m := sampleReconcile()
	m.Groups[1].Ranges[0].Mode = RangeSum
	return m
}

// TestReconcileSumRoundTrip: a round with a range sum is version 2, one
// without stays version 1 (a version-1 peer reads it), both round-trip.
func TestReconcileSumRoundTrip(t *testing.T) {
	for _, c := range []struct {
		m *Reconcile
		v uint64
	}{{sampleReconcile(), ReconcileVersion}, {sampleSum(), ReconcileSumVersion}} {
		b, err := EncodeReconcile(c.m)
		if err != nil {
			t.Fatal(err)
		}
		var w wireReconcile
		if err := Unmarshal("reconcile", b, &w, MaxReconcileBytes); err != nil || w.V != c.v {
			t.Fatalf("encoded as version %d (%v), want %d", w.V, err, c.v)
		}
		got, err := DecodeReconcile(b)
		if err != nil || !reflect.DeepEqual(got, c.m) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, got, c.m)
		}
	}
	m := sampleSum()
	m.Groups[0].Ranges[3].Mode = RangeSum // a sum among other ranges
	m.Groups[0].Ranges[3].Keys, m.Groups[0].Ranges[3].Need = nil, nil
	if _, err := EncodeReconcile(m); !errors.Is(err, ErrReconcileInvalid) {
		t.Fatalf("sum among ranges: %v", err)
	}
}

func TestReconcileRoundTrip(t *testing.T) {
	m := sampleReconcile()
	b, err := EncodeReconcile(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReconcile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip changed the message:\n%+v\n%+v", got, m)
	}
	b2, err := EncodeReconcile(got)
	if err != nil || !bytes.Equal(b, b2) {
		t.Fatalf("encoding is not a fixed point: %v", err)
	}
	k := rkey(4, 77, 3)
	if k.Site() != testSite(4) || k.HLC() != 77 || k.ID()[0] != 3 {
		t.Fatalf("key fields: %v %v %v", k.Site(), k.HLC(), k.ID())
	}
}

// TestReconcileRejectsProtocolViolations: the writer refuses what the
// reader refuses (the same Validate), with ErrReconcileInvalid.
func TestReconcileRejectsProtocolViolations(t *testing.T) {
	cases := map[string]func(m *Reconcile){
		"no range":            func(m *Reconcile) { m.Groups[1].Ranges = nil },
		"groups unordered":    func(m *Reconcile) { m.Groups[0], m.Groups[1] = m.Groups[1], m.Groups[0] },
		"group twice":         func(m *Reconcile) { m.Groups[1].Table = "a" },
		"empty table":         func(m *Reconcile) { m.Groups[1].Table = "" },
		"bound not ascending": func(m *Reconcile) { m.Groups[0].Ranges[1].Upper = bnd(rkey(1, 0, 0), 17) },
		"last bounded":        func(m *Reconcile) { m.Groups[1].Ranges[0].Upper = []byte{1} },
		"inner unbounded":     func(m *Reconcile) { m.Groups[0].Ranges[0].Upper = nil },
		"bound too long":      func(m *Reconcile) { m.Groups[0].Ranges[0].Upper = make([]byte, ReconcileKeySize+1) },
		"mode":                func(m *Reconcile) { m.Groups[0].Ranges[0].Mode = 9 },
		"fp in a skip":        func(m *Reconcile) { m.Groups[0].Ranges[0].FP[0] = 1 },
		"keys in a skip":      func(m *Reconcile) { m.Groups[0].Ranges[0].Keys = []ReconcileKey{rkey(1, 1, 1)} },
		"need in an id list":  func(m *Reconcile) { m.Groups[0].Ranges[2].Need = []byte{1} },
		"keys unordered": func(m *Reconcile) {
			r := &m.Groups[0].Ranges[2]
			r.Keys[0], r.Keys[1] = r.Keys[1], r.Keys[0]
		},
		"key outside range": func(m *Reconcile) { m.Groups[0].Ranges[2].Keys[0] = rkey(0, 1, 1) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := sampleReconcile()
			mutate(m)
			if _, err := EncodeReconcile(m); !errors.Is(err, ErrReconcileInvalid) {
				t.Fatalf("encode: %v, want ErrReconcileInvalid", err)
			}
			if err := m.Validate(); !errors.Is(err, ErrReconcileInvalid) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("validate: %v", err)
			}
		})
	}
}

// TestReconcileDecoderTypedErrors: unknown version, trailing bytes,
// oversize input, wrong types and bad packing are typed errors.
func TestReconcileDecoderTypedErrors(t *testing.T) {
	good, err := EncodeReconcile(sampleReconcile())
	if err != nil {
		t.Fatal(err)
	}
	v2 := enc(t, map[string]any{"v": 4, "g": []any{}})
	sumRange := []any{int(RangeSum), 0, []byte{}, make([]byte, FingerprintSize), []byte{}}
	cases := []struct {
		name string
		in   []byte
		kind error
	}{
		{"version", v2, ErrUnsupportedVersion},
		{"sum in version 1", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{sumRange}}}}), ErrUnsupportedVersion},
		{"version 2 without a sum", enc(t, map[string]any{"v": 2, "g": []any{[]any{"s", "t", 0, []any{[]any{1, 0, []byte{}, make([]byte, FingerprintSize), []byte{}}}}}}), ErrUnsupportedVersion},
		{"short sum", enc(t, map[string]any{"v": 2, "g": []any{[]any{"s", "t", 0, []any{[]any{int(RangeSum), 0, []byte{}, []byte{1}, []byte{}}}}}}), ErrReconcileInvalid},
		{"sum beside another range", enc(t, map[string]any{"v": 2, "g": []any{[]any{"s", "t", 0, []any{
			[]any{int(RangeSum), 0, []byte{1}, make([]byte, FingerprintSize), []byte{}}, []any{0, 0, []byte{}, []byte{}, []byte{}}}}}}), ErrReconcileInvalid},
		{"trailing", append(bytes.Clone(good), 0), ErrTrailingBytes},
		{"oversize", make([]byte, MaxReconcileBytes+1), ErrTooLarge},
		{"wrong type", enc(t, map[string]any{"v": 1, "g": "x"}), ErrMalformed},
		{"unknown field", enc(t, map[string]any{"v": 1, "g": []any{}, "x": 1}), ErrMalformed},
		{"range too short", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{[]any{1, 0}}}}}), ErrMalformed},
		{"bad packed key", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{[]any{2, 0, []byte{}, []byte{}, []byte{0, 3, 1, 2, 3}}}}}}), ErrReconcileInvalid},
		{"short fingerprint", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{[]any{1, 0, []byte{}, []byte{1}, []byte{}}}}}}), ErrReconcileInvalid},
		{"last bounded", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{[]any{0, 0, []byte{1}, []byte{}, []byte{}}}}}}), ErrReconcileInvalid},
		{"shared past previous", enc(t, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{
			[]any{0, 3, []byte{1}, []byte{}, []byte{}}, []any{0, 0, []byte{}, []byte{}, []byte{}}}}}}), ErrReconcileInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := DecodeReconcile(c.in)
			if m != nil || !errors.Is(err, c.kind) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, %v; want %v", m, err, c.kind)
			}
		})
	}
}

// reconcileWithRanges builds a one-group message of n skip/fingerprint ranges.
func reconcileWithRanges(n int) *Reconcile {
	g := ReconcileGroup{Schema: "s", Table: "t"}
	for i := 0; i < n; i++ {
		r := ReconcileRange{Mode: RangeSkip}
		if i < n-1 {
			r.Upper = []byte{byte(i >> 8), byte(i), 1}
		}
		g.Ranges = append(g.Ranges, r)
	}
	return &Reconcile{Groups: []ReconcileGroup{g}}
}

// TestReconcileLimitsAtAndPastTheEdge: the writer and the reader accept a
// message at each limit and refuse one past it.
func TestReconcileLimitsAtAndPastTheEdge(t *testing.T) {
	t.Run("ranges", func(t *testing.T) {
		at := reconcileWithRanges(MaxReconcileRanges)
		b, err := EncodeReconcile(at)
		if err != nil {
			t.Fatalf("at the limit: %v", err)
		}
		if _, err := DecodeReconcile(b); err != nil {
			t.Fatalf("decode at the limit: %v", err)
		}
		past := reconcileWithRanges(MaxReconcileRanges + 1)
		if _, err := EncodeReconcile(past); !errors.Is(err, ErrReconcileInvalid) {
			t.Fatalf("encode past the limit: %v", err)
		}
		if _, err := DecodeReconcile(enc(t, wireOf(t, past))); !errors.Is(err, ErrMalformed) {
			t.Fatalf("decode past the limit: %v", err)
		}
	})
	t.Run("keys", func(t *testing.T) {
		keysMsg := func(n int) *Reconcile {
			r := ReconcileRange{Mode: RangeIDList}
			for i := 0; i < n; i++ {
				r.Keys = append(r.Keys, rkey(1, HLC(i), 0))
			}
			return &Reconcile{Groups: []ReconcileGroup{{Schema: "s", Table: "t", Ranges: []ReconcileRange{r}}}}
		}
		b, err := EncodeReconcile(keysMsg(MaxReconcileKeys))
		if err != nil {
			t.Fatalf("at the limit: %v", err)
		}
		if _, err := DecodeReconcile(b); err != nil {
			t.Fatalf("decode at the limit: %v", err)
		}
		past := keysMsg(MaxReconcileKeys + 1)
		if _, err := EncodeReconcile(past); !errors.Is(err, ErrReconcileInvalid) {
			t.Fatalf("encode past the limit: %v", err)
		}
		if _, err := DecodeReconcile(enc(t, wireOf(t, past))); !errors.Is(err, ErrReconcileInvalid) {
			t.Fatalf("decode past the limit: %v", err)
		}
	})
	t.Run("groups", func(t *testing.T) {
		groupsMsg := func(n int) *Reconcile {
			m := &Reconcile{}
			for i := 0; i < n; i++ {
				m.Groups = append(m.Groups, ReconcileGroup{Schema: "s", Table: string(rune('a'+i/26/26)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26)),
					Ranges: []ReconcileRange{{Mode: RangeSkip}}})
			}
			return m
		}
		b, err := EncodeReconcile(groupsMsg(MaxReconcileGroups))
		if err != nil {
			t.Fatalf("at the limit: %v", err)
		}
		if _, err := DecodeReconcile(b); err != nil {
			t.Fatalf("decode at the limit: %v", err)
		}
		past := groupsMsg(MaxReconcileGroups + 1)
		if _, err := EncodeReconcile(past); !errors.Is(err, ErrReconcileInvalid) {
			t.Fatalf("encode past the limit: %v", err)
		}
		if _, err := DecodeReconcile(enc(t, wireOf(t, past))); !errors.Is(err, ErrReconcileInvalid) {
			t.Fatalf("decode past the limit: %v", err)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		// The decoder refuses a byte past the limit before parsing; the
		// largest message the encoder can build (all limits at once)
		// fits under it.
		r := ReconcileRange{Mode: RangeIDList}
		for i := 0; i < MaxReconcileKeys; i++ {
			var k ReconcileKey
			for j := range k {
				k[j] = byte(i*7 + j*13)
			}
			k[0], k[1] = byte(i>>8), byte(i)
			r.Keys = append(r.Keys, k)
		}
		b, err := EncodeReconcile(&Reconcile{Groups: []ReconcileGroup{{Schema: "s", Table: "t", Ranges: []ReconcileRange{r}}}})
		if err != nil || len(b) > MaxReconcileBytes {
			t.Fatalf("largest key list: %d bytes, %v", len(b), err)
		}
		if _, err := DecodeReconcile(append(make([]byte, MaxReconcileBytes-len(b)), b...)); errors.Is(err, ErrTooLarge) {
			t.Fatal("input at the byte limit refused as too large")
		}
		if _, err := DecodeReconcile(make([]byte, MaxReconcileBytes+1)); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("past the byte limit: %v", err)
		}
	})
}

// wireOf encodes m without validation (what a hostile writer sends).
func wireOf(t testing.TB, m *Reconcile) any {
	t.Helper()
	w := wireReconcile{V: ReconcileVersion}
	for _, g := range m.Groups {
		wg := wireGroup{Schema: g.Schema, Table: g.Table, Bound: g.Bound}
		var prev []byte
		for _, r := range g.Ranges {
			wr := wireRange{Mode: uint64(r.Mode), Suffix: []byte{}, Data: []byte{}, Keys: packKeys(r.Keys)}
			if r.Upper != nil {
				n := sharedLen(prev, r.Upper)
				wr.Shared, wr.Suffix, prev = uint64(n), r.Upper[n:], r.Upper
			}
			wg.Ranges = append(wg.Ranges, wr)
		}
		w.Groups = append(w.Groups, wg)
	}
	return &w
}

func sampleFetch() *ReconcileFetch {
	return &ReconcileFetch{Groups: []FetchGroup{
		{Schema: "app", Table: "a", Keys: []ReconcileKey{rkey(1, 1, 1), rkey(1, 2, 1)}},
		{Schema: "app", Table: "b", Keys: []ReconcileKey{rkey(2, 1, 1)}},
	}}
}

func TestReconcileFetchEventsAck(t *testing.T) {
	f := sampleFetch()
	b, err := EncodeReconcileFetch(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReconcileFetch(b)
	if err != nil || !reflect.DeepEqual(got, f) {
		t.Fatalf("fetch round trip: %v %+v", err, got)
	}
	for name, mutate := range map[string]func(*ReconcileFetch){
		"empty group": func(f *ReconcileFetch) { f.Groups[1].Keys = nil },
		"unordered": func(f *ReconcileFetch) {
			f.Groups[0].Keys[0], f.Groups[0].Keys[1] = f.Groups[0].Keys[1], f.Groups[0].Keys[0]
		},
		"groups twice": func(f *ReconcileFetch) { f.Groups[1].Table = "a" },
	} {
		f := sampleFetch()
		mutate(f)
		if _, err := EncodeReconcileFetch(f); !errors.Is(err, ErrReconcileInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Fetch keys at and past the limit.
	big := &ReconcileFetch{Groups: []FetchGroup{{Schema: "s", Table: "t"}}}
	for i := 0; i < MaxReconcileKeys; i++ {
		big.Groups[0].Keys = append(big.Groups[0].Keys, rkey(1, HLC(i), 0))
	}
	if b, err := EncodeReconcileFetch(big); err != nil {
		t.Fatalf("fetch at the limit: %v", err)
	} else if _, err := DecodeReconcileFetch(b); err != nil {
		t.Fatalf("decode fetch at the limit: %v", err)
	}
	big.Groups[0].Keys = append(big.Groups[0].Keys, rkey(1, HLC(MaxReconcileKeys), 0))
	if _, err := EncodeReconcileFetch(big); !errors.Is(err, ErrReconcileInvalid) {
		t.Fatalf("fetch past the limit: %v", err)
	}
	past := enc(t, &wireFetch{V: 1, Groups: []wireFetchGroup{{Schema: "s", Table: "t", Keys: packKeys(big.Groups[0].Keys)}}})
	if _, err := DecodeReconcileFetch(past); !errors.Is(err, ErrReconcileInvalid) {
		t.Fatalf("decode fetch past the limit: %v", err)
	}

	ev := &ReconcileEvents{Events: [][]byte{{1, 2}, {3}}}
	b, err = EncodeReconcileEvents(ev)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeReconcileEvents(b); err != nil || !reflect.DeepEqual(got, ev) {
		t.Fatalf("events round trip: %v %+v", err, got)
	}
	if _, err := EncodeReconcileEvents(&ReconcileEvents{Events: [][]byte{{}}}); !errors.Is(err, ErrReconcileInvalid) {
		t.Fatalf("empty event: %v", err)
	}
	many := &ReconcileEvents{}
	for i := 0; i < MaxReconcileEvents; i++ {
		many.Events = append(many.Events, []byte{1})
	}
	if b, err := EncodeReconcileEvents(many); err != nil {
		t.Fatalf("events at the limit: %v", err)
	} else if _, err := DecodeReconcileEvents(b); err != nil {
		t.Fatalf("decode events at the limit: %v", err)
	}
	many.Events = append(many.Events, []byte{1})
	if _, err := EncodeReconcileEvents(many); !errors.Is(err, ErrReconcileInvalid) {
		t.Fatalf("events past the limit: %v", err)
	}
	if _, err := DecodeReconcileEvents(enc(t, &wireEvents{V: 1, Events: many.Events})); !errors.Is(err, ErrMalformed) {
		t.Fatalf("decode events past the limit: %v", err)
	}
	if _, err := DecodeReconcileEvents(enc(t, &wireEvents{V: 3, Events: [][]byte{}})); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("events version: %v", err)
	}

	a := &ReconcileAck{Applied: 3, Dropped: 1}
	b, err = EncodeReconcileAck(a)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeReconcileAck(b); err != nil || *got != *a {
		t.Fatalf("ack round trip: %v %+v", err, got)
	}
	if _, err := DecodeReconcileAck(append(b, 0)); !errors.Is(err, ErrTrailingBytes) {
		t.Fatalf("ack trailing: %v", err)
	}
}

// FuzzDecodeReconcile: never panics, every failure matches ErrMalformed,
// every accepted message re-encodes and decodes to itself.
func FuzzDecodeReconcile(f *testing.F) {
	good, _ := EncodeReconcile(sampleReconcile())
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 0))
	f.Add([]byte{0xa0})
	f.Add(enc(f, map[string]any{"v": 2, "g": []any{}}))
	sum, _ := EncodeReconcile(sampleSum())
	f.Add(sum)
	f.Add(enc(f, map[string]any{"v": 1, "g": []any{[]any{"s", "t", 0, []any{[]any{2, 0, []byte{}, []byte{}, []byte{0, 3, 1, 2, 3}}}}}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := DecodeReconcile(in)
		if err != nil {
			if m != nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("bad failure: %v", err)
			}
			return
		}
		b, err := EncodeReconcile(m)
		if err != nil {
			t.Fatalf("accepted message does not encode: %v", err)
		}
		m2, err := DecodeReconcile(b)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzDecodeReconcileFetchEvents: the fetch, events and ack decoders never
// panic and fail only with ErrMalformed.
func FuzzDecodeReconcileFetchEvents(f *testing.F) {
	fb, _ := EncodeReconcileFetch(sampleFetch())
	eb, _ := EncodeReconcileEvents(&ReconcileEvents{Events: [][]byte{{1}}})
	ab, _ := EncodeReconcileAck(&ReconcileAck{Applied: 1})
	for _, s := range [][]byte{fb, eb, ab, fb[:len(fb)-1], append(bytes.Clone(eb), 0), {0xa0}} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if m, err := DecodeReconcileFetch(in); err != nil {
			if m != nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("fetch: %v", err)
			}
		} else if b, err := EncodeReconcileFetch(m); err != nil {
			t.Fatalf("accepted fetch does not encode: %v", err)
		} else if m2, err := DecodeReconcileFetch(b); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("fetch round trip: %v", err)
		}
		if e, err := DecodeReconcileEvents(in); err != nil {
			if e != nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("events: %v", err)
			}
		} else if _, err := EncodeReconcileEvents(e); err != nil {
			t.Fatalf("accepted events do not encode: %v", err)
		}
		if a, err := DecodeReconcileAck(in); err != nil && (a != nil || !errors.Is(err, ErrMalformed)) {
			t.Fatalf("ack: %v", err)
		}
	})
}

// sampleRangeSums is a version-3 round: fingerprints from range sums,
// with and without a whole-group range sum.
func sampleRangeSums() *Reconcile {
	m := sampleSum()
	m.SumRanges = true
	return m
}

// TestReconcileRangeSumVersion: a round whose fingerprints come from
// range sums is version 3 whatever its modes, round-trips, and a version
// this build does not speak is a typed error.
func TestReconcileRangeSumVersion(t *testing.T) {
	for _, m := range []*Reconcile{sampleRangeSums(), func() *Reconcile { m := sampleReconcile(); m.SumRanges = true; return m }()} {
		b, err := EncodeReconcile(m)
		if err != nil {
			t.Fatal(err)
		}
		var w wireReconcile
		if err := Unmarshal("reconcile", b, &w, MaxReconcileBytes); err != nil || w.V != ReconcileRangeSumVersion {
			t.Fatalf("encoded as version %d (%v), want %d", w.V, err, ReconcileRangeSumVersion)
		}
		got, err := DecodeReconcile(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, got, m)
		}
	}
	if _, err := DecodeReconcile(enc(t, map[string]any{"v": 4, "g": []any{}})); !errors.Is(err, ErrUnsupportedVersion) || !errors.Is(err, ErrMalformed) {
		t.Fatalf("version 4: %v", err)
	}
	if m, err := DecodeReconcile(enc(t, map[string]any{"v": 3, "g": []any{}})); err != nil || !m.SumRanges {
		t.Fatalf("empty version-3 round: %+v, %v", m, err)
	}
}

// FuzzDecodeReconcileRangeSums: the version-3 decoder never panics, every
// failure matches ErrMalformed, every accepted message re-encodes and
// decodes to itself (and keeps its version).
func FuzzDecodeReconcileRangeSums(f *testing.F) {
	good, _ := EncodeReconcile(sampleRangeSums())
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add(append(bytes.Clone(good), 0))
	f.Add(enc(f, map[string]any{"v": 3, "g": []any{}}))
	f.Add(enc(f, map[string]any{"v": 3, "g": []any{[]any{"s", "t", 0, []any{[]any{4, 0, []byte{}, make([]byte, 16), []byte{}}}}}}))
	f.Add(enc(f, map[string]any{"v": 3, "g": []any{[]any{"s", "t", 0, []any{[]any{1, 0, []byte{1}, make([]byte, 16), []byte{}}, []any{1, 0, []byte{}, make([]byte, 15), []byte{}}}}}}))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := DecodeReconcile(in)
		if err != nil {
			if m != nil || !errors.Is(err, ErrMalformed) {
				t.Fatalf("bad failure: %v", err)
			}
			return
		}
		b, err := EncodeReconcile(m)
		if err != nil {
			t.Fatalf("accepted message does not encode: %v", err)
		}
		m2, err := DecodeReconcile(b)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
