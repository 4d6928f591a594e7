package messages

import (
	"bytes"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// Columns.Encode writes CBOR by hand; it must be byte-identical to the
// codec's Core Deterministic Encoding of the same map.
func TestColumnsEncodeMatchesDeterministicCodec(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := Columns{}
		for i, n := 0, rapid.IntRange(0, 30).Draw(t, "n"); i < n; i++ {
			name := rapid.StringMatching(`[a-zA-Zé_]{1,40}`).Draw(t, "name")
			if rapid.Bool().Draw(t, "long") {
				name = strings.Repeat(name, rapid.IntRange(1, 300).Draw(t, "rep"))
				if len(name) > 70000 {
					name = name[:70000]
				}
			}
			var v any
			switch rapid.IntRange(0, 4).Draw(t, "kind") {
			case 0:
				v = nil
			case 1:
				v = rapid.Int64().Draw(t, "int")
			case 2:
				v = rapid.String().Draw(t, "str")
			case 3:
				v = rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")
			case 4:
				v = rapid.Float64().Draw(t, "float")
			}
			c[name] = MustValue(v)
		}
		m := make(map[string]cborRaw, len(c))
		for k, v := range c {
			m[k] = cborRaw(v)
		}
		want, err := Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := c.Encode()
		if !bytes.Equal(got, want) {
			t.Fatalf("Encode differs from the codec:\n got %x\nwant %x", got, want)
		}
		back, err := DecodeColumns(got)
		if err != nil || len(back) != len(c) {
			t.Fatalf("round trip: %v (%d vs %d)", err, len(back), len(c))
		}
	})
}
