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
