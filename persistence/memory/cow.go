package memory

import "hash/maphash"

// nShards is the number of shards of a cowMap. A transaction clones only the
// shards it writes, so a write costs O(len/nShards), not O(len).
const nShards = 128

var seed = maphash.MakeSeed()

func shardOf[K comparable](k K) int { return int(maphash.Comparable(seed, k) % nShards) }

// cowMap is a copy-on-write sharded map. A committed cowMap is never
// mutated: a transaction works on a value copy of it, copies the shard
// table the first time it writes to the map and clones a shard the first
// time it writes to that shard (both tracked by gen), so snapshots held by
// readers stay unchanged. A map never written has no table: an empty
// store and a transaction's copy of the state cost a few words per map.
// Up to smallMax entries a map is one plain map cloned whole on write (a
// shard table is 2 KiB, and an idle device's store holds several maps of
// a few entries each); past it the entries move into the shard table.
type cowMap[K comparable, V any] struct {
	small map[K]V // the entries while t is nil
	sgen  uint64  // generation of the transaction that cloned small
	t     *shardTable[K, V]
	tgen  uint64 // generation of the transaction that copied t
	gen   uint64 // generation of the transaction writing this copy
}

// smallMax is the most entries a cowMap keeps without a shard table.
const smallMax = 32

type shardTable[K comparable, V any] struct {
	shards [nShards]map[K]V
	owner  [nShards]uint64 // generation of the transaction that cloned the shard
}

func (c *cowMap[K, V]) begin(gen uint64) { c.gen = gen }

func (c *cowMap[K, V]) get(k K) (V, bool) {
	if c.t == nil {
		v, ok := c.small[k]
		return v, ok
	}
	v, ok := c.t.shards[shardOf(k)][k]
	return v, ok
}

func (c *cowMap[K, V]) own(i int) map[K]V {
	switch {
	case c.t == nil:
		c.t, c.tgen = &shardTable[K, V]{}, c.gen
	case c.tgen != c.gen:
		cp := *c.t
		c.t, c.tgen = &cp, c.gen
	}
	t := c.t
	if t.owner[i] != c.gen || t.shards[i] == nil {
		old := t.shards[i]
		n := make(map[K]V, len(old)+1)
		for k, v := range old {
			n[k] = v
		}
		t.shards[i] = n
		t.owner[i] = c.gen
	}
	return t.shards[i]
}

// ownSmall returns small cloned for this transaction.
func (c *cowMap[K, V]) ownSmall() map[K]V {
	if c.small == nil || c.sgen != c.gen {
		n := make(map[K]V, len(c.small)+1)
		for k, v := range c.small {
			n[k] = v
		}
		c.small, c.sgen = n, c.gen
	}
	return c.small
}

func (c *cowMap[K, V]) put(k K, v V) {
	if c.t == nil {
		if _, ok := c.small[k]; ok || len(c.small) < smallMax {
			c.ownSmall()[k] = v
			return
		}
		// Past smallMax: the entries move into a table of this
		// transaction's shards (small itself is left to the snapshots).
		t := &shardTable[K, V]{}
		for k, v := range c.small {
			i := shardOf(k)
			if t.shards[i] == nil {
				t.shards[i], t.owner[i] = map[K]V{}, c.gen
			}
			t.shards[i][k] = v
		}
		c.t, c.tgen, c.small = t, c.gen, nil
	}
	c.own(shardOf(k))[k] = v
}

func (c *cowMap[K, V]) del(k K) {
	i := shardOf(k)
	if c.t == nil {
		if _, ok := c.small[k]; ok {
			delete(c.ownSmall(), k)
		}
		return
	}
	if _, ok := c.t.shards[i][k]; !ok {
		return
	}
	delete(c.own(i), k)
}

func (c *cowMap[K, V]) each(fn func(K, V)) {
	if c.t == nil {
		for k, v := range c.small {
			fn(k, v)
		}
		return
	}
	for _, s := range c.t.shards {
		for k, v := range s {
			fn(k, v)
		}
	}
}
