package runtime

import (
	"context"

	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// PeerOption configures a peer in AddPeer and AcceptPeer (PeerSite).
type PeerOption struct{ apply func(*replicate.PeerOptions) }

// PeerSite binds a peer name to the site id of the node behind it. Only
// a bound peer's watermark claims count, and only those about its own
// site's groups: no peer speaks for another site, so no relay can make
// this node, or through it anyone, skip a site's events (SSP/1 §14.2; see
// docs/replication.md). Without a binding the peer's events still apply;
// its claims are refused and counted. A name once bound stays bound.
func PeerSite(site messages.SiteID) PeerOption {
	return PeerOption{func(o *replicate.PeerOptions) { o.Site, o.BindSite = site, true }}
}

func peerOptions(opts []PeerOption) replicate.PeerOptions {
	var o replicate.PeerOptions
	for _, f := range opts {
		if f.apply != nil {
			f.apply(&o)
		}
	}
	return o
}

// AcceptPeer accepts pushes from peer without pushing to it (AddPeer does
// both). peer is the name the transport authenticates: the Network's
// registered name, or the Remote peer bound to a TLS certificate. Receive
// progress, inbound status and metric series exist only for accepted
// peers.
//
// A node attached to a Network (Register) or a Remote (Serve, Host,
// Config.Remote) also reconciles with an accepted peer over that
// transport (Reconcile), on the same triggers as an added peer — Trust,
// DefineTable, the schedule, an Open from a restore — so what a one-way
// link's pushes could not apply comes back without a link the other way.
func (n *Node) AcceptPeer(peer string, opts ...PeerOption) error {
	if n.isClosed() {
		return ErrClosed
	}
	if err := n.sync.AcceptPeer(peer, peerOptions(opts)); err != nil {
		return err
	}
	n.peerAccepted(peer) // reconcile.go
	return nil
}

// ReplicationStats are the sync plane's refusal counters (what hostile
// or misconfigured peers tried).
type ReplicationStats struct {
	// RefusedPushes counts pushes refused before anything was kept
	// (unknown sender, a From the transport did not authenticate).
	RefusedPushes uint64
	// RefusedClaims counts watermark claims refused by the progress rule.
	RefusedClaims uint64
	// HeldQuotaRejections counts events rejected by a signer's held quota.
	HeldQuotaRejections uint64
}

// ReplicationStats returns the refusal counters since the node opened.
func (n *Node) ReplicationStats() ReplicationStats { return ReplicationStats(n.sync.Stats()) }

// PurgeHeld drops what is held for group g (SSP/1 §13.6: events waiting
// for a table that is not defined here) — the held entries and the events
// themselves — and returns how many it removed. It is the operator's way
// out of a table that will never exist: the events are gone from this
// node (and no longer relayed); a peer may offer them again, within the
// signer's held quota, unless the table is put out of Config.Scope.
func (n *Node) PurgeHeld(ctx context.Context, g GroupKey) (int, error) {
	if n.isClosed() {
		return 0, ErrClosed
	}
	var removed int
	err := n.router.Write(ctx, func(tx persistence.SyncTx) error { // the committer: one writer
		var err error
		removed, err = tx.PurgeHeld(g)
		return err
	})
	return removed, err
}
