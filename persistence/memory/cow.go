package memory

import "hash/maphash"

// nShards is the number of shards of a cowMap. A transaction clones only the
// shards it writes, so a write costs O(len/nShards), not O(len).
const nShards = 128

var seed = maphash.MakeSeed()

func shardOf[K comparable](k K) int { return int(maphash.Comparable(seed, k) % nShards) }

// cowMap is a copy-on-write sharded map. A committed cowMap is never
// mutated: a transaction works on a value copy of it and clones a shard the
// first time it writes to it (tracked by gen), so snapshots held by readers
// stay unchanged.
type cowMap[K comparable, V any] struct {
	shards [nShards]map[K]V
	owner  [nShards]uint64 // generation of the transaction that cloned the shard
	gen    uint64          // generation of the transaction writing this copy
}

func (c *cowMap[K, V]) begin(gen uint64) { c.gen = gen }

func (c *cowMap[K, V]) get(k K) (V, bool) {
	v, ok := c.shards[shardOf(k)][k]
	return v, ok
}

func (c *cowMap[K, V]) own(i int) map[K]V {
	if c.owner[i] != c.gen || c.shards[i] == nil {
		old := c.shards[i]
		n := make(map[K]V, len(old)+1)
		for k, v := range old {
			n[k] = v
		}
		c.shards[i] = n
		c.owner[i] = c.gen
	}
	return c.shards[i]
}

func (c *cowMap[K, V]) put(k K, v V) { c.own(shardOf(k))[k] = v }

func (c *cowMap[K, V]) del(k K) {
	i := shardOf(k)
	if _, ok := c.shards[i][k]; !ok {
		return
	}
	delete(c.own(i), k)
}

func (c *cowMap[K, V]) each(fn func(K, V)) {
	for _, s := range c.shards {
		for k, v := range s {
			fn(k, v)
		}
	}
}
