package runtime

import (
	"fmt"
	"slices"
	"testing"
)

// Scan visits rows in the natural order of their keys on both stores:
// text bytewise (not shortest first, as the CBOR encoding sorts), negative
// integers below positive ones (not after them), composite keys column by
// column in the table's key column order.
func TestScanFollowsNaturalKeyOrder(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			var n *testNode
			if store == "bolt" {
				n = openTestNode(t, Config{Dir: t.TempDir()})
			} else {
				n = openTestNode(t, Config{})
			}
			for _, c := range []struct {
				table string
				keys  []string
				rows  []map[string]any
				want  []string
			}{
				{"s", []string{"k"}, []map[string]any{{"k": "zzz"}, {"k": "ab"}, {"k": "Z"}, {"k": "b"}, {"k": "aa"}, {"k": "c"}}, []string{"Z", "aa", "ab", "b", "c", "zzz"}},
				{"i", []string{"k"}, []map[string]any{{"k": 300}, {"k": -1}, {"k": 24}, {"k": 2}, {"k": -100}, {"k": 10}, {"k": 23}}, []string{"-100", "-1", "2", "10", "23", "24", "300"}},
				// Declared (z, a): z first, although "a" sorts first by name.
				{"c", []string{"z", "a"}, []map[string]any{{"z": 2, "a": "x"}, {"z": 1, "a": "yy"}, {"z": 1, "a": "b"}, {"z": -5, "a": "zz"}}, []string{"-5/zz", "1/b", "1/yy", "2/x"}},
			} {
				if err := n.DefineTable(n.ctx, TableDef{Schema: "app", Table: c.table, KeyColumns: c.keys, Columns: []string{"v"}}); err != nil {
					t.Fatal(err)
				}
				for _, k := range c.rows {
					if _, err := n.Upsert(n.ctx, "app", c.table, k, map[string]any{"v": 1}); err != nil {
						t.Fatal(err)
					}
				}
				var got []string
				if err := n.Scan(n.ctx, "app", c.table, ScanOptions{}, func(r Row) bool {
					var parts []string
					for _, col := range c.keys {
						var v any
						if err := r.Key[col].Decode(&v); err != nil {
							t.Fatal(err)
						}
						parts = append(parts, fmt.Sprint(v))
					}
					got = append(got, fmt.Sprint(parts[0]))
					if len(parts) > 1 {
						got[len(got)-1] += "/" + parts[1]
					}
					return true
				}); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, c.want) {
					t.Errorf("table %s: Scan visits %v, want %v", c.table, got, c.want)
				}
			}
		})
	}
}
