package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
)

// visible renders what a reader sees of every row of a table, tombstones
// included, without clocks (two nodes writing the same values at other
// HLCs see the same).
func visible(t testing.TB, n *Node, schema, table string) string {
	t.Helper()
	var b strings.Builder
	err := n.Scan(context.Background(), schema, table, ScanOptions{IncludeDeleted: true}, func(r Row) bool {
		fmt.Fprintf(&b, "%x exists=%v", r.Key.Encode(), r.Exists)
		for _, c := range []string{"a", "b", "c"} {
			cell := r.Cells[c]
			fmt.Fprintf(&b, " %s=%d:%x", c, cell.State, []byte(cell.Value))
		}
		b.WriteString("\n")
		return true
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return b.String()
}

func logLen(t testing.TB, n *Node) int {
	t.Helper()
	l, err := n.Log(context.Background(), 0, 100_000)
	if err != nil {
		t.Fatalf("log: %v", err)
	}
	return len(l)
}

// A batch writes every row, each as its own signed event with its own
// HLC, and a peer applying those events one by one gets the same rows.
func TestBatchWritesEachRowAsItsOwnEvent(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			cfg := Config{}
			if store == "bolt" {
				cfg.Dir = t.TempDir()
			}
			n := openTestNode(t, cfg)
			n.define(defT)
			var b Batch
			for i := range 100 {
				b.Upsert("app", "t", map[string]any{"id": i}, map[string]any{"a": i, "b": "x"})
			}
			b.Delete("app", "t", map[string]any{"id": 7})
			b.Upsert("app", "t", map[string]any{"id": 8}, map[string]any{"a": nil})
			outs, err := n.Write(n.ctx, &b)
			if err != nil {
				t.Fatalf("write: %v", err)
			}
			if len(outs) != b.Len() {
				t.Fatalf("%d outcomes for %d writes", len(outs), b.Len())
			}
			ids, hlcs := map[messages.EventID]bool{}, map[messages.HLC]bool{}
			for i, o := range outs {
				if o.Kind != messages.Applied || ids[o.ID] || hlcs[o.HLC] {
					t.Fatalf("write %d: outcome %+v (not applied, or a shared id or HLC)", i, o)
				}
				ids[o.ID], hlcs[o.HLC] = true, true
			}
			if got := logLen(t, n.Node); got != b.Len() {
				t.Fatalf("log has %d events, want %d", got, b.Len())
			}
			if _, ok := n.get(7); ok {
				t.Fatal("row 7 deleted in the batch is visible")
			}
			r, ok := n.get(8)
			var a *int
			if st, err := r.Value("a", &a); !ok || err != nil || st != Written || a != nil {
				t.Fatalf("row 8: ok %v state %v a %v err %v, want an explicit null", ok, st, a, err)
			}
			if r, ok := n.get(42); !ok {
				t.Fatal("row 42 missing")
			} else if s, st := cellString(t, r, "b"); s != "x" || st != Written {
				t.Fatalf("row 42 b = %q (%v)", s, st)
			}
			// Each event stands alone: a peer verifies and applies them one
			// by one and reads the same rows.
			other := openTestNode(t, Config{})
			other.define(defT)
			if err := other.Trust(other.ctx, n.signer.Key()); err != nil {
				t.Fatal(err)
			}
			log, err := n.Log(n.ctx, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range log {
				if out := other.apply(e.Raw); out.Kind != messages.Applied {
					t.Fatalf("peer: %+v", out)
				}
			}
			if a, b := visible(t, n.Node, "app", "t"), visible(t, other.Node, "app", "t"); a != b {
				t.Fatalf("peer differs:\n%s\nvs\n%s", a, b)
			}
		})
	}
}

// A bad write anywhere in a batch refuses the whole batch with a
// *BatchError naming it; nothing of the batch is kept (no row, no event).
func TestBatchBadWriteRefusesWholeBatch(t *testing.T) {
	other := TableDef{Schema: "other", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}}
	cases := []struct {
		name  string
		bad   func(b *Batch)
		index int
		want  error
	}{
		{"unknown table", func(b *Batch) { b.Upsert("app", "nope", map[string]any{"id": 1}, nil) }, 2, ErrUnknownTable},
		{"unknown column", func(b *Batch) { b.Upsert("app", "t", map[string]any{"id": 1}, map[string]any{"zz": 1}) }, 2, ErrUnknownColumn},
		{"missing key column", func(b *Batch) { b.Upsert("app", "t", map[string]any{"other": 1}, nil) }, 2, ErrInvalidKey},
		{"nil key", func(b *Batch) { b.Delete("app", "t", map[string]any{"id": nil}) }, 2, ErrInvalidKey},
		{"unencodable value", func(b *Batch) { b.Upsert("app", "t", map[string]any{"id": 1}, map[string]any{"a": make(chan int)}) }, 2, nil},
		{"out of scope", func(b *Batch) { b.Upsert("other", "t", map[string]any{"id": 1}, map[string]any{"a": 1}) }, 2, ErrOutOfScope},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := openTestNode(t, Config{Scope: []string{"app/*"}})
			n.define(defT)
			n.define(other)
			if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 0}, map[string]any{"a": "before"}); err != nil {
				t.Fatal(err)
			}
			before, events := visible(t, n.Node, "app", "t"), logLen(t, n.Node)
			var b Batch
			b.Upsert("app", "t", map[string]any{"id": 0}, map[string]any{"a": "after"})
			b.Upsert("app", "t", map[string]any{"id": 5}, map[string]any{"a": 5})
			c.bad(&b)
			b.Upsert("app", "t", map[string]any{"id": 6}, map[string]any{"a": 6})
			outs, err := n.Write(n.ctx, &b)
			var be *BatchError
			if !errors.As(err, &be) || be.Index != c.index || outs != nil {
				t.Fatalf("write: outs %v err %v, want a BatchError at %d", outs, err, c.index)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("err %v does not match %v", err, c.want)
			}
			if got := visible(t, n.Node, "app", "t"); got != before {
				t.Fatalf("rows changed:\n%s\nwas\n%s", got, before)
			}
			if got := logLen(t, n.Node); got != events {
				t.Fatalf("log grew from %d to %d", events, got)
			}
			// The node still writes.
			if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": 5}, map[string]any{"a": 5}); err != nil {
				t.Fatalf("upsert after a refused batch: %v", err)
			}
		})
	}
}

// The batch bound is checked at its edge: MaxBatchRows writes pass, one
// more is refused before anything is signed.
func TestBatchLimit(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defT)
	var b Batch
	for i := range MaxBatchRows + 1 {
		b.Upsert("app", "t", map[string]any{"id": i % 50}, map[string]any{"a": i})
	}
	_, err := n.Write(n.ctx, &b)
	var be *BatchError
	if !errors.Is(err, ErrBatchTooLarge) || !errors.As(err, &be) || be.Index != -1 {
		t.Fatalf("oversized batch: %v", err)
	}
	if logLen(t, n.Node) != 0 {
		t.Fatal("an oversized batch wrote events")
	}
	b.ops = b.ops[:MaxBatchRows]
	if outs, err := n.Write(n.ctx, &b); err != nil || len(outs) != MaxBatchRows {
		t.Fatalf("batch at the limit: %d outcomes, %v", len(outs), err)
	}
	if outs, err := n.Write(n.ctx, new(Batch)); err != nil || outs != nil {
		t.Fatalf("empty batch: %v %v", outs, err)
	}
}

// Writing a sequence of upserts and deletes as batches (cut at random
// points) gives the same rows as writing it one call at a time, on both
// stores.
func TestPropertyBatchEqualsSequential(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			open := func() *testNode {
				cfg := Config{}
				if store == "bolt" {
					cfg.Dir = t.TempDir()
				}
				return openTestNode(t, cfg)
			}
			// One pair of nodes, a fresh table per run: opening stores per
			// run would cost more than the run.
			seq, bat := open(), open()
			run := 0
			rapid.Check(t, func(rt *rapid.T) {
				run++
				def := defT
				def.Table = fmt.Sprintf("t%d", run)
				seq.define(def)
				bat.define(def)
				var b Batch
				flush := func() {
					if _, err := bat.Write(bat.ctx, &b); err != nil {
						rt.Fatalf("batch: %v", err)
					}
					b.Reset()
				}
				for i, ops := 0, rapid.IntRange(1, 30).Draw(rt, "ops"); i < ops; i++ {
					key := map[string]any{"id": rapid.IntRange(0, 4).Draw(rt, "row")}
					if rapid.IntRange(0, 3).Draw(rt, "op") == 0 {
						if _, err := seq.Delete(seq.ctx, "app", def.Table, key); err != nil {
							rt.Fatal(err)
						}
						b.Delete("app", def.Table, key)
					} else {
						vals := map[string]any{}
						for _, c := range []string{"a", "b", "c"} {
							switch rapid.IntRange(0, 3).Draw(rt, "cell") {
							case 1:
								vals[c] = nil
							case 2, 3:
								vals[c] = rapid.IntRange(0, 9).Draw(rt, "v")
							}
						}
						if _, err := seq.Upsert(seq.ctx, "app", def.Table, key, vals); err != nil {
							rt.Fatal(err)
						}
						b.Upsert("app", def.Table, key, vals)
					}
					if rapid.IntRange(0, 5).Draw(rt, "cut") == 0 {
						flush()
					}
				}
				flush()
				if a, c := visible(t, seq.Node, "app", def.Table), visible(t, bat.Node, "app", def.Table); a != c {
					rt.Fatalf("sequential:\n%s\nbatched:\n%s", a, c)
				}
			})
		})
	}
}
