package messages

import (
	"errors"
	"testing"
)

// TestCheckReadableMatchesTheDecoder: what the strict decoder reads passes
// the writer's check, and one element, pair or level more is ErrTooLarge
// at the writer, as it is at the reader.
func TestCheckReadableMatchesTheDecoder(t *testing.T) {
	nested := func(levels int) any {
		var v any = 0
		for range levels {
			v = []any{v}
		}
		return v
	}
	pairs := func(n int) map[int]int {
		m := make(map[int]int, n)
		for i := range n {
			m[i] = i
		}
		return m
	}
	for name, c := range map[string]struct{ at, past any }{
		"array":   {make([]int, MaxArrayElements), make([]int, MaxArrayElements+1)},
		"map":     {pairs(MaxMapPairs), pairs(MaxMapPairs + 1)},
		"nesting": {nested(maxNesting), nested(maxNesting + 1)},
	} {
		at, err := Marshal(c.at)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckReadable(name, at); err != nil {
			t.Errorf("%s at the bound: writer refused: %v", name, err)
		}
		var v any
		if err := Unmarshal(name, at, &v, 0); err != nil {
			t.Errorf("%s at the bound: reader refused: %v", name, err)
		}
		past, err := Marshal(c.past)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckReadable(name, past); !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s past the bound: writer: %v, want ErrTooLarge", name, err)
		}
		if err := Unmarshal(name, past, &v, 0); err == nil {
			t.Errorf("%s past the bound: the reader accepted it", name)
		}
	}
	if err := CheckReadable("garbage", []byte{0xff}); !errors.Is(err, ErrMalformed) || errors.Is(err, ErrTooLarge) {
		t.Errorf("garbage: %v, want ErrMalformed", err)
	}
}
