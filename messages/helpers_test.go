package messages

import (
	"bytes"
	"testing"
)

// enc returns the canonical CBOR encoding of v, failing the test on error.
func enc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testSite(seed byte) SiteID {
	var s SiteID
	for i := range s {
		s[i] = seed + byte(i)
	}
	return s
}

func sampleUpsert() *Event {
	return &Event{
		Site:   testSite(1),
		HLC:    HLC(1_700_000_000_000<<16 | 7),
		Schema: "app",
		Table:  "notes",
		Key:    Columns{"id": MustValue("n1"), "tenant": MustValue(uint64(3))},
		Payload: Columns{
			"title": MustValue("hello"),
			"body":  Null,
			"tags":  MustValue([]any{"a", "b"}),
			"blob":  MustValue([]byte{1, 2, 3}),
			"n":     MustValue(int64(-5)),
		},
	}
}

func sampleDelete() *Event {
	return &Event{Site: testSite(2), HLC: 99, Schema: "app", Table: "notes", Key: Columns{"id": MustValue("n1")}, Delete: true}
}

// wireMap returns a generic map form of a valid event, for building broken
// variants field by field.
func wireMap(t testing.TB) map[string]any {
	t.Helper()
	s := testSite(1)
	return map[string]any{
		"v":       1,
		"site":    s[:],
		"hlc":     uint64(12345),
		"schema":  "app",
		"table":   "notes",
		"key":     map[string]any{"id": "n1"},
		"payload": map[string]any{"title": "x"},
	}
}

// eventEqual compares events semantically: columns by their value bytes.
func eventEqual(a, b *Event) bool {
	if a.Site != b.Site || a.HLC != b.HLC || a.Schema != b.Schema || a.Table != b.Table || a.Delete != b.Delete {
		return false
	}
	return columnsEqual(a.Key, b.Key) && (a.Payload == nil) == (b.Payload == nil) && columnsEqual(a.Payload, b.Payload)
}

func columnsEqual(a, b Columns) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
