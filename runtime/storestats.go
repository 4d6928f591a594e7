package runtime

// StoreCommits counts the read-write storage transactions a node committed
// since Open, per plane. With fsync on, one bbolt commit costs two
// fdatasyncs (data pages, then the meta page): benchmarks divide these by
// the work done to report fsyncs per message or per push.
type StoreCommits struct {
	// Sync counts committed sync-plane transactions.
	Sync uint64
	// Delivery counts committed delivery-plane transactions.
	Delivery uint64
}

// StoreCommits returns the node's committed read-write transactions; zero
// for an in-memory node (nothing is written to disk).
func (n *Node) StoreCommits() StoreCommits {
	if n.db == nil {
		return StoreCommits{}
	}
	c := n.db.Commits()
	return StoreCommits{Sync: c.Sync, Delivery: c.Delivery}
}

// StoreWrites is what a node's committed delivery-plane transactions wrote
// since Open: each commit writes the pages it changed and the meta page,
// and its two fdatasyncs wait for them.
type StoreWrites struct {
	// Commits counts committed delivery-plane transactions.
	Commits uint64
	// Pages and Bytes are what they wrote.
	Pages, Bytes uint64
}

// DeliveryStoreWrites returns what the node's delivery-plane commits
// wrote; zero for an in-memory node.
func (n *Node) DeliveryStoreWrites() StoreWrites {
	if n.db == nil {
		return StoreWrites{}
	}
	w := n.db.DeliveryWrites()
	return StoreWrites{Commits: w.Commits, Pages: w.Pages, Bytes: w.Bytes}
}
