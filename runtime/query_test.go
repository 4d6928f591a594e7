package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

var defQ = TableDef{Schema: "app", Table: "q", KeyColumns: []string{"k"}, Columns: []string{"owner", "n", "title"},
	Types:   map[string]ColumnType{"owner": TypeText, "n": TypeInteger, "title": TypeText},
	Indexes: []IndexDef{{Name: "by_owner_n", Columns: []string{"owner", "n"}}, {Name: "by_title", Columns: []string{"title"}}}}

func keyStrings(t *testing.T, n *testNode, q Query) []string {
	t.Helper()
	var out []string
	for r, err := range n.Query(n.ctx, q) {
		if err != nil {
			t.Fatalf("query %+v: %v", q, err)
		}
		var k any
		if err := r.Key["k"].Decode(&k); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(k))
	}
	return out
}

// The key order is the natural one: strings bytewise (not shortest
// first), negative integers below positive ones (not after them).
func TestQueryKeyOrderIsNatural(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			n := openStoreNode(t, store)
			def := TableDef{Schema: "app", Table: "s", KeyColumns: []string{"k"}, Columns: []string{"v"}}
			n.define(def)
			for _, k := range []any{"zzz", "ab", "Z", "b", "aa", "c"} {
				if _, err := n.Upsert(n.ctx, "app", "s", map[string]any{"k": k}, map[string]any{"v": 1}); err != nil {
					t.Fatal(err)
				}
			}
			got := keyStrings(t, n, Query{Schema: "app", Table: "s"})
			if want := []string{"Z", "aa", "ab", "b", "c", "zzz"}; !slices.Equal(got, want) {
				t.Fatalf("text keys in %v, want %v", got, want)
			}
			def.Table = "i"
			n.define(def)
			for _, k := range []any{300, -1, 24, 2, -100, 10, 23} {
				if _, err := n.Upsert(n.ctx, "app", "i", map[string]any{"k": k}, map[string]any{"v": 1}); err != nil {
					t.Fatal(err)
				}
			}
			q := Query{Schema: "app", Table: "i"}
			got = keyStrings(t, n, q)
			if want := []string{"-100", "-1", "2", "10", "23", "24", "300"}; !slices.Equal(got, want) {
				t.Fatalf("integer keys in %v, want %v", got, want)
			}
			q.From, q.To = -1, 24
			if got, want := keyStrings(t, n, q), []string{"-1", "2", "10", "23"}; !slices.Equal(got, want) {
				t.Fatalf("range [-1, 24): %v, want %v", got, want)
			}
		})
	}
}

func TestQueryIndexEqualityRangePrefixCursor(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			n := openStoreNode(t, store)
			n.define(defQ)
			rows := []struct {
				k        int
				owner    string
				n        int
				title    string
				deleted  bool
				noValues bool
			}{
				{1, "ann", 3, "buy milk", false, false},
				{2, "bob", 1, "walk", false, false},
				{3, "ann", 1, "bake", false, false},
				{4, "ann", 2, "buy eggs", true, false},
				{5, "ann", -4, "call", false, false},
				{6, "carl", 9, "buy bread", false, false},
			}
			for _, r := range rows {
				if _, err := n.Upsert(n.ctx, "app", "q", map[string]any{"k": r.k}, map[string]any{"owner": r.owner, "n": r.n, "title": r.title}); err != nil {
					t.Fatal(err)
				}
				if r.deleted {
					if _, err := n.Delete(n.ctx, "app", "q", map[string]any{"k": r.k}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, c := range []struct {
				q    Query
				want []string
			}{
				{Query{Index: "by_owner_n", Eq: []any{"ann"}}, []string{"5", "3", "1"}},
				{Query{Index: "by_owner_n", Eq: []any{"ann"}, From: 0}, []string{"3", "1"}},
				{Query{Index: "by_owner_n", Eq: []any{"ann"}, To: 3}, []string{"5", "3"}},
				{Query{Index: "by_owner_n", Eq: []any{"ann", 1}}, []string{"3"}},
				{Query{Index: "by_owner_n", Prefix: "b"}, []string{"2"}},
				{Query{Index: "by_owner_n"}, []string{"5", "3", "1", "2", "6"}},
				{Query{Index: "by_title", Prefix: "buy "}, []string{"6", "1"}},
				{Query{Index: "by_title", From: "c"}, []string{"5", "2"}},
				{Query{Index: "by_owner_n", Limit: 2}, []string{"5", "3"}},
				{Query{Eq: []any{3}}, []string{"3"}},
				{Query{From: 2, To: 5}, []string{"2", "3"}},
			} {
				c.q.Schema, c.q.Table = "app", "q"
				if got := keyStrings(t, n, c.q); !slices.Equal(got, c.want) {
					t.Errorf("%+v: got %v, want %v", c.q, got, c.want)
				}
			}
			// Paging with the cursor visits each row once, in order.
			q := Query{Schema: "app", Table: "q", Index: "by_owner_n", Limit: 2}
			var all []string
			for page := 0; page < 10; page++ {
				rows, next, err := n.QueryPage(n.ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) == 0 {
					if next != nil {
						t.Fatalf("empty page with a cursor %x", next)
					}
					break
				}
				for _, r := range rows {
					var k int
					_ = r.Key["k"].Decode(&k)
					all = append(all, fmt.Sprint(k))
				}
				q.After = next
			}
			if want := []string{"5", "3", "1", "2", "6"}; !slices.Equal(all, want) {
				t.Fatalf("paged: %v, want %v", all, want)
			}
		})
	}
}

func TestQueryBadQueriesAreTypedErrors(t *testing.T) {
	n := openTestNode(t, Config{})
	n.define(defQ)
	for _, c := range []struct {
		q    Query
		want error
	}{
		{Query{Table: "nope"}, ErrUnknownTable},
		{Query{Index: "nope"}, ErrUnknownIndex},
		{Query{Index: "by_owner_n", Eq: []any{"a", 1, 2}}, ErrBadQuery},
		{Query{Index: "by_owner_n", Eq: []any{"a", 1}, From: 1}, ErrBadQuery},
		{Query{Index: "by_owner_n", Prefix: "a", From: "b"}, ErrBadQuery},
		{Query{Index: "by_owner_n", Prefix: 7}, ErrBadQuery},
		{Query{Limit: -1}, ErrBadQuery},
		{Query{Limit: MaxQueryLimit + 1}, ErrBadQuery},
		{Query{Index: "by_owner_n", Eq: []any{7}}, ErrTypeMismatch},
		{Query{Index: "by_owner_n", Eq: []any{"ann"}, From: "x"}, ErrTypeMismatch},
		{Query{Index: "by_owner_n", Eq: []any{"ann"}, Prefix: "x"}, ErrTypeMismatch},
		{Query{Index: "by_owner_n", Prefix: []byte("x")}, ErrTypeMismatch},
	} {
		if c.q.Table == "" {
			c.q.Table = "q"
		}
		c.q.Schema = "app"
		var got error
		rows := 0
		for _, err := range n.Query(n.ctx, c.q) {
			if err != nil {
				got = err
			} else {
				rows++
			}
		}
		if !errors.Is(got, c.want) || rows != 0 {
			t.Errorf("%+v: err %v, rows %d; want %v and none", c.q, got, rows, c.want)
		}
	}
	var te *TypeError
	for _, err := range n.Query(n.ctx, Query{Schema: "app", Table: "q", Index: "by_owner_n", Eq: []any{7}}) {
		if !errors.As(err, &te) || te.Column != "owner" {
			t.Fatalf("err %v, want a *TypeError for owner", err)
		}
	}
}

func TestEnsureTableAddsAnIndex(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			n := openStoreNode(t, store)
			def := defQ
			def.Indexes = nil
			n.define(def)
			for i := range 25 {
				if _, err := n.Upsert(n.ctx, "app", "q", map[string]any{"k": i}, map[string]any{"owner": fmt.Sprint("o", i%3), "n": -i}); err != nil {
					t.Fatal(err)
				}
			}
			if err := n.EnsureTable(n.ctx, defQ); err != nil {
				t.Fatal(err)
			}
			got := keyStrings(t, n, Query{Schema: "app", Table: "q", Index: "by_owner_n", Eq: []any{"o1"}})
			if want := []string{"22", "19", "16", "13", "10", "7", "4", "1"}; !slices.Equal(got, want) {
				t.Fatalf("by_owner_n o1: %v, want %v", got, want)
			}
			// Again: a no-op. Another index under a stored name: a conflict.
			if err := n.EnsureTable(n.ctx, defQ); err != nil {
				t.Fatal(err)
			}
			bad := defQ
			bad.Indexes = []IndexDef{{Name: "by_title", Columns: []string{"owner"}}}
			if err := n.EnsureTable(n.ctx, bad); !errors.Is(err, ErrTableConflict) {
				t.Fatalf("index redefined: %v, want ErrTableConflict", err)
			}
		})
	}
}

func openStoreNode(t *testing.T, store string) *testNode {
	t.Helper()
	if store == "bolt" {
		return openTestNode(t, Config{Dir: t.TempDir()})
	}
	return openTestNode(t, Config{})
}

// A received value larger than a bbolt key in an indexed column is
// indexed (cut, see Query) instead of failing the apply of its batch.
func TestQueryLongIndexedValueIsIndexed(t *testing.T) {
	for _, store := range []string{"memory", "bolt"} {
		t.Run(store, func(t *testing.T) {
			p := newPeer(t, 1)
			cfg := Config{}
			if store == "bolt" {
				cfg.Dir = t.TempDir()
			}
			n := openP(t, cfg, defP1, []*peer{p})
			defer n.Close()
			base := newWall().MS()
			long := strings.Repeat("x", 40000)
			e1 := p.event(&messages.Event{HLC: hlcAt(base, 1), Schema: "app", Table: "p", Key: messages.Columns{"g": messages.MustValue("a"), "id": messages.MustValue(1)}, Payload: messages.Columns{"owner": messages.MustValue(long)}})
			e2 := p.event(&messages.Event{HLC: hlcAt(base, 2), Schema: "app", Table: "p", Key: messages.Columns{"g": messages.MustValue("a"), "id": messages.MustValue(2)}, Payload: messages.Columns{"owner": messages.MustValue("ok")}})
			outs, err := n.ApplySignedBatch(context.Background(), [][]byte{e1, e2})
			if err != nil || len(outs) != 2 || outs[0].Kind != messages.Applied || outs[1].Kind != messages.Applied {
				t.Fatalf("apply: %v, %v", outs, err)
			}
			// An index compares the first ordkey.MaxIndexValue bytes of a
			// value: a longer query value would match every row sharing
			// them, so it is refused rather than answered inexactly.
			for _, q := range []Query{
				{Schema: "app", Table: "p", Index: "by_owner", Eq: []any{long}},
				{Schema: "app", Table: "p", Index: "by_owner", From: long},
				{Schema: "app", Table: "p", Index: "by_owner", Prefix: long[:2000]},
			} {
				if _, _, err := n.QueryPage(context.Background(), q); !errors.Is(err, ErrBadQuery) {
					t.Fatalf("query by a value longer than the index compares: %v, want ErrBadQuery", err)
				}
			}
			got := 0
			for r, err := range n.Query(context.Background(), Query{Schema: "app", Table: "p", Index: "by_owner", Prefix: long[:500]}) {
				if err != nil {
					t.Fatal(err)
				}
				var id int
				_ = r.Key["id"].Decode(&id)
				if id != 1 {
					t.Fatalf("row %d for the long owner", id)
				}
				got++
			}
			if got != 1 {
				t.Fatalf("%d rows for the long owner, want 1", got)
			}
		})
	}
}
