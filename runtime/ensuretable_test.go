package runtime

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// EnsureTable against every stored state: missing, equal, behind (def has
// more columns: they are added), ahead (def has fewer: kept), and a
// conflicting key, which alone fails.
func TestEnsureTable(t *testing.T) {
	base := TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}
	with := func(cols ...string) TableDef { d := base; d.Columns = cols; return d }
	cases := []struct {
		name        string
		stored      *TableDef
		ensure      TableDef
		wantColumns []string
		wantErr     error
	}{
		{"missing table", nil, base, []string{"a", "b"}, nil},
		{"same definition", &base, base, []string{"a", "b"}, nil},
		{"stored behind", &base, with("a", "b", "c"), []string{"a", "b", "c"}, nil},
		{"stored ahead", ptr(with("a", "b", "c")), base, []string{"a", "b", "c"}, nil},
		{"both sides added", ptr(with("a", "b", "x")), with("a", "b", "y"), []string{"a", "b", "x", "y"}, nil},
		{"other order", &base, with("b", "a"), []string{"a", "b"}, nil},
		{"other key", &base, TableDef{Schema: "app", Table: "t", KeyColumns: []string{"uid"}, Columns: []string{"a"}}, []string{"a", "b"}, ErrTableConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := openTestNode(t, Config{})
			if c.stored != nil {
				n.define(*c.stored)
			}
			err := n.EnsureTable(n.ctx, c.ensure)
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("EnsureTable: %v, want %v", err, c.wantErr)
			}
			if err == nil {
				// Idempotent: a second call changes nothing.
				if err := n.EnsureTable(n.ctx, c.ensure); err != nil {
					t.Fatalf("second EnsureTable: %v", err)
				}
			}
			defs, err := n.Tables(n.ctx)
			if err != nil || len(defs) != 1 {
				t.Fatalf("tables: %v %v", defs, err)
			}
			if !slices.Equal(defs[0].Columns, c.wantColumns) || !slices.Equal(defs[0].KeyColumns, []string{"id"}) {
				t.Fatalf("stored %+v, want columns %v", defs[0], c.wantColumns)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A column EnsureTable adds is rebuilt from the retained log, like
// AddColumn: a value received while the column was unknown comes back.
func TestEnsureTableRebuildsAddedColumn(t *testing.T) {
	n, p := nodeWithPeer(t, Config{})
	h := hlcAt(n.wall.MS(), 1)
	if out := n.apply(p.upsert(h, 1, map[string]any{"a": "x", "zz": "early"})); out.Kind != messages.Applied {
		t.Fatalf("apply: %+v", out)
	}
	def := defT
	def.Columns = append(slices.Clone(def.Columns), "zz")
	if err := n.EnsureTable(n.ctx, def); err != nil {
		t.Fatal(err)
	}
	r, _ := n.get(1)
	if s, st := cellString(t, r, "zz"); s != "early" || st != Written {
		t.Fatalf("zz = %q (%v), want the value received before the column existed", s, st)
	}
}

// Regression: after AddColumn, a restart that defines the table with the
// definition it had before (a rollback of the application, or a node of
// a rolling upgrade that has not got the new code) starts, and the column
// and its values stay. With DefineTable, the start-up pattern the README
// showed, it failed with ErrTableConflict and the process exited.
func TestRestartWithOlderDefinitionAfterAddColumn(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	n := openTestNode(t, Config{Dir: dir})
	if err := n.EnsureTable(ctx, defAB); err != nil {
		t.Fatal(err)
	}
	if err := n.AddColumn(ctx, "app", "t", "z"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 1}, map[string]any{"a": "a1", "z": "z1"}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openTestNode(t, Config{Dir: dir})
	if err := n.DefineTable(ctx, defAB); !errors.Is(err, ErrTableConflict) {
		t.Fatalf("DefineTable with the older definition: %v, want ErrTableConflict (DefineTable stays strict)", err)
	}
	if err := n.EnsureTable(ctx, defAB); err != nil {
		t.Fatalf("restart with the older definition: %v", err)
	}
	r, ok := n.get(1)
	if s, st := cellString(t, r, "z"); !ok || s != "z1" || st != Written {
		t.Fatalf("z after the restart: %q (%v), row found %v", s, st, ok)
	}
	if _, err := n.Upsert(ctx, "app", "t", map[string]any{"id": 2}, map[string]any{"a": "a2"}); err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
}
