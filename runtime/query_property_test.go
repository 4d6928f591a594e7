package runtime

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence/ordkey"
)

// defP1 and defP2 are two schema versions of app.p: the second adds the
// column late and an index over it.
var (
	defP1 = TableDef{Schema: "app", Table: "p", KeyColumns: []string{"g", "id"}, Columns: []string{"owner", "n"},
		Types:   map[string]ColumnType{"g": TypeText, "id": TypeInteger, "owner": TypeText, "n": TypeInteger},
		Indexes: []IndexDef{{Name: "by_owner", Columns: []string{"owner", "n"}}}}
	defP2 = TableDef{Schema: "app", Table: "p", KeyColumns: []string{"g", "id"}, Columns: []string{"owner", "n", "late"},
		Types:   map[string]ColumnType{"g": TypeText, "id": TypeInteger, "owner": TypeText, "n": TypeInteger, "late": TypeInteger},
		Indexes: []IndexDef{{Name: "by_owner", Columns: []string{"owner", "n"}}, {Name: "by_late", Columns: []string{"late"}}}}
)

func openP(t *testing.T, cfg Config, def TableDef, peers []*peer) *Node {
	t.Helper()
	cfg.MeshID, cfg.ReconcileInterval = testMesh, -1
	if cfg.Wall == nil {
		cfg.Wall = newWall().Now
	}
	if cfg.Dir == "" {
		cfg.InMemory = true
	}
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if err := n.EnsureTable(context.Background(), def); err != nil {
		t.Fatal(err)
	}
	for _, p := range peers {
		if err := n.Trust(context.Background(), p.key()); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// pEvent draws one signed event of app.p: an upsert of some of owner, n
// (sometimes a value of the wrong type, kept as received) and late, or
// a delete.
func pEvent(rt *rapid.T, p *peer, h messages.HLC) []byte {
	key := messages.Columns{
		"g":  messages.MustValue(rapid.SampledFrom([]string{"", "a", "ab", "b"}).Draw(rt, "g")),
		"id": messages.MustValue(rapid.IntRange(-2, 2).Draw(rt, "id")),
	}
	e := &messages.Event{HLC: h, Schema: "app", Table: "p", Key: key}
	if rapid.IntRange(0, 4).Draw(rt, "kind") == 0 {
		e.Delete = true
		return p.event(e)
	}
	e.Payload = messages.Columns{}
	if rapid.Bool().Draw(rt, "owner?") {
		e.Payload["owner"] = messages.MustValue(rapid.SampledFrom([]any{"ann", "anna", "bob", "", nil}).Draw(rt, "owner"))
	}
	if rapid.Bool().Draw(rt, "n?") {
		e.Payload["n"] = messages.MustValue(rapid.SampledFrom([]any{-5, -1, 0, 1, 3, 7, "x", nil, 2.5}).Draw(rt, "n"))
	}
	if rapid.Bool().Draw(rt, "late?") {
		e.Payload["late"] = messages.MustValue(rapid.IntRange(-3, 3).Draw(rt, "late"))
	}
	return p.event(e)
}

// pQuery draws a query of app.p valid for def.
func pQuery(rt *rapid.T, def TableDef) Query {
	q := Query{Schema: "app", Table: "p", Limit: rapid.SampledFrom([]int{1, 2, 3, 100}).Draw(rt, "limit")}
	indexes := []string{"", "by_owner"}
	if _, ok := def.Index("by_late"); ok {
		indexes = append(indexes, "by_late")
	}
	q.Index = rapid.SampledFrom(indexes).Draw(rt, "index")
	texts := []any{"", "a", "ab", "ann", "b", "bob"}
	ints := []any{-5, -2, -1, 0, 1, 2, 3, 7}
	var first, second []any
	switch q.Index {
	case "":
		first, second = texts, ints
	case "by_owner":
		first, second = texts, ints
	case "by_late":
		first = ints
	}
	switch rapid.IntRange(0, 5).Draw(rt, "shape") {
	case 1:
		q.Eq = []any{rapid.SampledFrom(first).Draw(rt, "eq")}
	case 2:
		if second != nil {
			q.Eq = []any{rapid.SampledFrom(first).Draw(rt, "eq")}
			q.From = rapid.SampledFrom(second).Draw(rt, "from")
			if rapid.Bool().Draw(rt, "to?") {
				q.To = rapid.SampledFrom(second).Draw(rt, "to")
			}
		}
	case 3:
		if q.Index != "by_late" {
			q.Prefix = rapid.SampledFrom([]string{"", "a", "an", "b", "z"}).Draw(rt, "prefix")
		}
	case 4:
		q.From = rapid.SampledFrom(first).Draw(rt, "from")
	case 5:
		q.To = rapid.SampledFrom(first).Draw(rt, "to")
	}
	return q
}

// colEnc is the ordered encoding of what a reader sees in column c of r
// (from the public Row: key value, or the cell by its state).
func colEnc(r Row, def TableDef, c string) []byte {
	if slices.Contains(def.KeyColumns, c) {
		return ordkey.AppendValue(nil, r.Key[c])
	}
	cell, ok := r.Cells[c]
	if !ok || cell.State == Unmaterialized {
		return ordkey.AppendAbsent(nil)
	}
	return ordkey.AppendValue(nil, cell.Value)
}

// filterScan answers q by a full Scan: every existing row, filtered by
// q's conditions column by column and sorted by the order's columns,
// then the key; it returns the rows' encoded keys.
func filterScan(t *testing.T, n *Node, def TableDef, q Query) []string {
	t.Helper()
	cols := def.KeyColumns
	if q.Index != "" {
		x, _ := def.Index(q.Index)
		cols = x.Columns
	}
	type hit struct {
		sort []byte
		key  string
	}
	var hits []hit
	if err := n.Scan(context.Background(), "app", "p", ScanOptions{}, func(r Row) bool {
		var sortKey []byte
		for i, c := range cols {
			e := colEnc(r, def, c)
			sortKey = append(sortKey, e...)
			if i < len(q.Eq) && !bytes.Equal(e, ordkey.AppendValue(nil, messages.MustValue(q.Eq[i]))) {
				return true
			}
			if i == len(q.Eq) {
				if p, ok := q.Prefix.(string); ok {
					var s string
					if r.Key[c] != nil {
						if r.Key[c].Kind() != "text" || r.Key[c].Decode(&s) != nil || !strings.HasPrefix(s, p) {
							return true
						}
					} else if cell := r.Cells[c]; cell.State != Written || cell.Value.Kind() != "text" || cell.Value.Decode(&s) != nil || !strings.HasPrefix(s, p) {
						return true
					}
				}
				if q.From != nil && bytes.Compare(e, ordkey.AppendValue(nil, messages.MustValue(q.From))) < 0 {
					return true
				}
				if q.To != nil && bytes.Compare(e, ordkey.AppendValue(nil, messages.MustValue(q.To))) >= 0 {
					return true
				}
			}
		}
		sortKey = ordkey.AppendRowKey(sortKey, def.KeyColumns, r.Key)
		hits = append(hits, hit{sortKey, string(r.Key.Encode())})
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(hits, func(a, b hit) int { return bytes.Compare(a.sort, b.sort) })
	var out []string
	for _, h := range hits {
		out = append(out, h.key)
	}
	return out
}

// pagedQuery reads every page of q with its cursor.
func pagedQuery(rt *rapid.T, n *Node, q Query) []string {
	var out []string
	for pages := 0; ; pages++ {
		if pages > 200 {
			rt.Fatalf("query %+v does not end", q)
		}
		got := 0
		var last Cursor
		for r, err := range n.Query(context.Background(), q) {
			if err != nil {
				rt.Fatalf("query %+v: %v", q, err)
			}
			out = append(out, string(r.Key.Encode()))
			last = r.Cursor
			got++
		}
		if got > q.Limit {
			rt.Fatalf("query %+v: page of %d rows", q, got)
		}
		if got == 0 {
			return out
		}
		q.After = last
	}
}

func keyList(keys []string) string {
	var out []string
	for _, k := range keys {
		c, _ := messages.DecodeColumns([]byte(k))
		var g string
		var id int
		_ = c["g"].Decode(&g)
		_ = c["id"].Decode(&id)
		out = append(out, fmt.Sprintf("%q/%d", g, id))
	}
	return strings.Join(out, " ")
}

// Every query's answer, read page by page with its cursor, equals a
// filter over a full scan, under random received upserts (with values of
// the wrong type), deletes, resurrections, eviction horizons, a column
// added (AddColumn through EnsureTable, rebuilt from the log) with an
// index over it built from the rows in chunks, and restarts (bolt:
// close and reopen; the memory store cannot outlive its node, its
// reopen is covered by storetest's IndexesProperty).
func TestQueryEqualsFilteredScanProperty(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				peers := []*peer{newPeer(t, 1)}
				cfg := Config{NoSync: true, AddColumnChunk: 2}
				if store == "bolt" {
					cfg.Dir = t.TempDir()
				}
				def := defP1
				n := openP(t, cfg, def, peers)
				defer func() { _ = n.Close() }()
				base := newWall().MS()
				logical := uint16(0)
				for range rapid.IntRange(1, 25).Draw(rt, "steps") {
					switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
					case op <= 4:
						var raws [][]byte
						for range rapid.IntRange(1, 4).Draw(rt, "events") {
							logical++
							raws = append(raws, pEvent(rt, peers[0], hlcAt(base, logical)))
						}
						applyAll(t, n, raws)
					case op == 5:
						h := hlcAt(base, uint16(rapid.IntRange(0, int(logical)).Draw(rt, "horizon")))
						if _, err := n.SetHorizon(context.Background(), "app", "p", h); err != nil {
							rt.Fatal(err)
						}
					case op == 6:
						def = defP2
						if err := n.EnsureTable(context.Background(), def); err != nil {
							rt.Fatal(err)
						}
					case op == 7 && store == "bolt":
						if err := n.Close(); err != nil {
							rt.Fatal(err)
						}
						// A restart with either schema version: the store
						// keeps what it has (EnsureTable accepts a store ahead).
						n = openP(t, cfg, rapid.SampledFrom([]TableDef{defP1, def}).Draw(rt, "restart def"), peers)
					default:
						for range 3 {
							q := pQuery(rt, def)
							if got, want := pagedQuery(rt, n, q), filterScan(t, n, def, q); !slices.Equal(got, want) {
								rt.Fatalf("query %+v:\n got  %s\n want %s", q, keyList(got), keyList(want))
							}
						}
					}
				}
				for range 5 {
					q := pQuery(rt, def)
					if got, want := pagedQuery(rt, n, q), filterScan(t, n, def, q); !slices.Equal(got, want) {
						rt.Fatalf("query %+v:\n got  %s\n want %s", q, keyList(got), keyList(want))
					}
				}
			})
		})
	}
}

// Two nodes on different schema versions (one with the column late and
// its index, one without) that receive the same events in different
// orders agree on every row's shared columns and answer the shared
// index's queries alike.
func TestQueryTwoSchemaVersionsConverge(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		peers := []*peer{newPeer(t, 1), newPeer(t, 2)}
		a := openP(t, Config{}, defP1, peers)
		defer a.Close()
		b := openP(t, Config{}, defP2, peers)
		defer b.Close()
		base := newWall().MS()
		var raws [][]byte
		for i := range rapid.IntRange(1, 30).Draw(rt, "events") {
			raws = append(raws, pEvent(rt, peers[i%2], hlcAt(base, uint16(i/2+1))))
		}
		applyAll(t, a, raws)
		shuffled := slices.Clone(raws)
		for i := len(shuffled) - 1; i > 0; i-- {
			j := rapid.IntRange(0, i).Draw(rt, "swap")
			shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
		}
		for _, r := range shuffled {
			applyAll(t, b, [][]byte{r})
		}
		shared := func(n *Node) map[string]string {
			out := map[string]string{}
			if err := n.Scan(context.Background(), "app", "p", ScanOptions{IncludeDeleted: true}, func(r Row) bool {
				s := fmt.Sprint(r.Exists)
				for _, c := range defP1.Columns {
					s += fmt.Sprintf(" %s=%d:%x", c, r.Cells[c].State, []byte(r.Cells[c].Value))
				}
				out[string(r.Key.Encode())] = s
				return true
			}); err != nil {
				rt.Fatal(err)
			}
			return out
		}
		if sa, sb := shared(a), shared(b); fmt.Sprint(sa) != fmt.Sprint(sb) {
			rt.Fatalf("shared columns differ:\n%v\n%v", sa, sb)
		}
		for range 5 {
			q := pQuery(rt, defP1)
			if ga, gb := pagedQuery(rt, a, q), pagedQuery(rt, b, q); !slices.Equal(ga, gb) {
				rt.Fatalf("query %+v: %s on v1, %s on v2", q, keyList(ga), keyList(gb))
			}
		}
		q := Query{Schema: "app", Table: "p", Index: "by_late", Limit: 100}
		if got, want := pagedQuery(rt, b, q), filterScan(t, b, defP2, q); !slices.Equal(got, want) {
			rt.Fatalf("by_late on v2: %s, want %s", keyList(got), keyList(want))
		}
	})
}
