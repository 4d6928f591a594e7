package runtime

import (
	"errors"
	"testing"
)

type todoRow struct {
	ID    int           `syncmesh:"id,key"`
	A     string        `syncmesh:"a"`
	B     Field[int]    `syncmesh:"b"`
	C     *string       `syncmesh:"c"`
	Local string        `syncmesh:"-"`
	Z     Field[string] `syncmesh:"z"`
}

// Struct mapping writes and reads rows, and every cell state stays
// reachable: a Field left Unmaterialized is not written (the column
// keeps its value), a NullField writes a null, a nil pointer writes a
// null, a delete reads back as Cleared, a column never written as
// Unmaterialized.
func TestStructMapping(t *testing.T) {
	n := openTestNode(t, Config{})
	def := defT
	def.Columns = []string{"a", "b", "c", "z"}
	def.Types = map[string]ColumnType{"b": TypeInteger}
	n.define(def)
	c := "note"
	if _, err := n.UpsertStruct(n.ctx, "app", "t", todoRow{ID: 1, A: "x", B: FieldOf(5), C: &c, Local: "not stored"}); err != nil {
		t.Fatal(err)
	}
	var got todoRow
	r, _ := n.get(1)
	if err := r.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.ID != 1 || got.A != "x" || got.B.State != Written || got.B.Value != 5 || got.B.Clock.IsZero() || got.C == nil || *got.C != "note" || got.Local != "" {
		t.Fatalf("read back %+v", got)
	}
	if got.Z.State != Unmaterialized {
		t.Fatalf("never-written z: %+v", got.Z)
	}
	// B left Unmaterialized keeps 5; C nil writes a null.
	if _, err := n.UpsertStruct(n.ctx, "app", "t", &todoRow{ID: 1, A: "y"}); err != nil {
		t.Fatal(err)
	}
	got = todoRow{C: &c}
	r, _ = n.get(1)
	if err := r.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.A != "y" || got.B.State != Written || got.B.Value != 5 || got.C != nil || r.Cells["c"].State != Written || !r.Cells["c"].Value.IsNull() {
		t.Fatalf("after a partial write %+v (cells %+v)", got, r.Cells)
	}
	// NullField writes an explicit null: Written, the zero value.
	if _, err := n.UpsertStruct(n.ctx, "app", "t", todoRow{ID: 1, A: "y", B: NullField[int]()}); err != nil {
		t.Fatal(err)
	}
	r, _ = n.get(1)
	if err := r.Decode(&got); err != nil || got.B.State != Written || !r.Cells["b"].Value.IsNull() {
		t.Fatalf("null field: %+v %v", got.B, err)
	}
	// A delete clears every cell, the never-written z too: Cleared.
	if _, err := n.Delete(n.ctx, "app", "t", map[string]any{"id": 1}); err != nil {
		t.Fatal(err)
	}
	err := n.Scan(n.ctx, "app", "t", ScanOptions{IncludeDeleted: true}, func(r Row) bool {
		got = todoRow{}
		if err := r.Decode(&got); err != nil || got.B.State != Cleared || got.Z.State != Cleared {
			t.Fatalf("deleted row: %+v %v", got, err)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	// A batch takes structs too; a value of the wrong type refuses it.
	var b Batch
	if err := b.UpsertStruct("app", "t", todoRow{ID: 2, A: "two"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Write(n.ctx, &b); err != nil {
		t.Fatal(err)
	}
	if r, ok := n.get(2); !ok || r.Cells["a"].State != Written {
		t.Fatalf("row from a batched struct: %v %+v", ok, r)
	}
}

// Struct mapping refuses what it cannot map, and a received value of the
// wrong type reads back into a struct as ErrTypeMismatch, the other
// fields filled.
func TestStructMappingErrors(t *testing.T) {
	n := openTestNode(t, Config{})
	def := defT
	def.Types = map[string]ColumnType{"b": TypeInteger}
	n.define(def)
	type noKey struct {
		A string `syncmesh:"a"`
	}
	for _, v := range []any{42, noKey{A: "x"}, (*todoRow)(nil)} {
		if _, err := n.UpsertStruct(n.ctx, "app", "t", v); !errors.Is(err, ErrNotStruct) {
			t.Fatalf("UpsertStruct(%T): %v", v, err)
		}
	}
	if err := (Row{}).Decode(todoRow{}); !errors.Is(err, ErrNotStruct) {
		t.Fatalf("Decode into a non-pointer: %v", err)
	}
	p := newPeer(t, 1)
	n.trust(p)
	n.apply(p.upsert(hlcAt(n.wall.MS(), 1), 3, map[string]any{"a": "ok", "b": "not a number"}))
	type row struct {
		ID int        `syncmesh:"id,key"`
		A  string     `syncmesh:"a"`
		B  Field[int] `syncmesh:"b"`
	}
	var got row
	r, _ := n.get(3)
	if err := r.Decode(&got); !errors.Is(err, ErrTypeMismatch) || got.A != "ok" || got.ID != 3 || got.B.State != Written || got.B.Value != 0 {
		t.Fatalf("decode of a mistyped cell: %+v %v", got, err)
	}
}
