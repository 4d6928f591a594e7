package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// An index build stopped after a chunk (a crash) leaves the index
// declared and pending: queries of it fail with ErrIndexBuilding, rows
// written meanwhile keep their own entries, and the next Open finishes
// the build, after which the index answers as a filter over the rows.
func TestIndexBuildInterruptedResumesOnOpen(t *testing.T) {
	dir := t.TempDir()
	injected := errors.New("crash")
	chunks := 0
	cfg := Config{Dir: dir, NoSync: true, AddColumnChunk: 3, Failpoint: func(name string) error {
		if name == FailpointIndexBuildChunk {
			if chunks++; chunks == 2 {
				return injected
			}
		}
		return nil
	}}
	def := defQ
	def.Indexes = nil
	n := openP(t, cfg, def, nil)
	ctx := context.Background()
	for i := range 20 {
		if _, err := n.Upsert(ctx, "app", "q", map[string]any{"k": i}, map[string]any{"owner": fmt.Sprint("o", i%2), "n": 20 - i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.EnsureTable(ctx, defQ); !errors.Is(err, injected) {
		t.Fatalf("EnsureTable at the failpoint: %v", err)
	}
	q := Query{Schema: "app", Table: "q", Index: "by_owner_n", Eq: []any{"o1"}}
	for _, err := range n.Query(ctx, q) {
		if !errors.Is(err, ErrIndexBuilding) {
			t.Fatalf("query while building: %v, want ErrIndexBuilding", err)
		}
	}
	// Written meanwhile: a row past the build's progress and one before it.
	if _, err := n.Upsert(ctx, "app", "q", map[string]any{"k": 19}, map[string]any{"owner": "o1", "n": -7}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Delete(ctx, "app", "q", map[string]any{"k": 1}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Failpoint = nil
	n = openP(t, cfg, def, nil) // an older definition at start-up: the index stays
	defer n.Close()
	var got []string
	for r, err := range n.Query(ctx, q) {
		if err != nil {
			t.Fatal(err)
		}
		var k int
		_ = r.Key["k"].Decode(&k)
		got = append(got, fmt.Sprint(k))
	}
	if want := []string{"19", "17", "15", "13", "11", "9", "7", "5", "3"}; !slices.Equal(got, want) {
		t.Fatalf("by_owner_n o1 after the resumed build: %v, want %v", got, want)
	}
}
