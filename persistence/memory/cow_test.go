package memory

import (
	"maps"
	"testing"

	"pgregory.net/rapid"
)

// A cowMap behaves as a map per transaction, and a committed copy never
// changes under later transactions: across the switch from one small map
// to the shard table (smallMax) and back and forth around it.
func TestCowMapSnapshotsStayAndTransactionsSeeTheirWrites(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var committed cowMap[int, int]
		want := map[int]int{}
		type snap struct {
			m    cowMap[int, int]
			want map[int]int
		}
		var snaps []snap
		for gen := uint64(1); gen <= uint64(rapid.IntRange(1, 12).Draw(t, "txs")); gen++ {
			tx := committed // a transaction's value copy of the state
			tx.begin(gen)
			next := maps.Clone(want)
			for range rapid.IntRange(0, 3*smallMax).Draw(t, "ops") {
				k := rapid.IntRange(0, 2*smallMax).Draw(t, "k")
				if rapid.Bool().Draw(t, "put") {
					tx.put(k, int(gen)*1000+k)
					next[k] = int(gen)*1000 + k
				} else {
					tx.del(k)
					delete(next, k)
				}
				if v, ok := tx.get(k); ok != hasKey(next, k) || (ok && v != next[k]) {
					t.Fatalf("tx %d: get(%d) = %d, %v; want %d", gen, k, v, ok, next[k])
				}
			}
			if rapid.Bool().Draw(t, "abort") {
				continue // the copy is dropped; committed stays
			}
			snaps = append(snaps, snap{committed, want})
			committed, want = tx, next
		}
		snaps = append(snaps, snap{committed, want})
		for i, s := range snaps {
			got := map[int]int{}
			s.m.each(func(k, v int) { got[k] = v })
			if !maps.Equal(got, s.want) {
				t.Fatalf("snapshot %d changed: %v, want %v", i, got, s.want)
			}
			for k, v := range s.want {
				if g, ok := s.m.get(k); !ok || g != v {
					t.Fatalf("snapshot %d: get(%d) = %d, %v; want %d", i, k, g, ok, v)
				}
			}
		}
	})
}

func hasKey(m map[int]int, k int) bool { _, ok := m[k]; return ok }
