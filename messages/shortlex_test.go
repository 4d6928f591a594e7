package messages

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The four copies CompareShortlex replaced (messages/value.go,
// messages/event.go, persistence/bolt/rowdecode.go and records.go), kept
// here as the reference the order must not move from.
func oldSortShortlex(a, b string) int {
	if len(a) != len(b) {
		return cmp.Compare(len(a), len(b))
	}
	return strings.Compare(a, b)
}

func oldShortlexLessBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return string(a) < string(b)
}

func oldShortlexLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func TestShortlexOrderIsUnchanged(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "a", -1}, {"b", "aa", -1}, {"ab", "aa", 1}, {"id", "id", 0},
		{"\xff", "\x00\x00", -1}, {"a\x00", "a\xff", -1}, {"z", "a", 1},
	} {
		if got := CompareShortlex(c.a, c.b); got != c.want {
			t.Errorf("CompareShortlex(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		a := string(rapid.SliceOfN(rapid.Byte(), 0, 6).Draw(t, "a"))
		b := string(rapid.SliceOfN(rapid.Byte(), 0, 6).Draw(t, "b"))
		if got, want := CompareShortlex(a, b), oldSortShortlex(a, b); got != want {
			t.Fatalf("CompareShortlex(%q, %q) = %d, the old order says %d", a, b, got, want)
		}
		if got, want := CompareShortlex([]byte(a), []byte(b)), oldSortShortlex(a, b); got != want {
			t.Fatalf("CompareShortlex on bytes (%q, %q) = %d, want %d", a, b, got, want)
		}
		if got, want := LessShortlex([]byte(a), []byte(b)), oldShortlexLessBytes([]byte(a), []byte(b)); got != want {
			t.Fatalf("LessShortlex on bytes (%q, %q) = %v, want %v", a, b, got, want)
		}
		if got, want := LessShortlex(a, b), oldShortlexLess(a, b); got != want {
			t.Fatalf("LessShortlex(%q, %q) = %v, want %v", a, b, got, want)
		}
		keys := rapid.SliceOfN(rapid.StringN(0, 4, -1), 0, 8).Draw(t, "keys")
		x, y := slices.Clone(keys), slices.Clone(keys)
		slices.SortFunc(x, CompareShortlex[string])
		slices.SortFunc(y, oldSortShortlex)
		if !slices.Equal(x, y) {
			t.Fatalf("sorted %q, the old order gives %q", x, y)
		}
	})
}
