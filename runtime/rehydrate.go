package runtime

import (
	"context"
	"fmt"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// maxRehydrateSessions bounds the reconciliation sessions of one
// Rehydrate: a session fetches at most what its replies carry, so a long
// history takes several.
const maxRehydrateSessions = 64

// RehydrateReport describes one rehydration.
type RehydrateReport struct {
	Peer          string
	Schema, Table string
	// OldHorizon is the table's horizon before; it is zero after.
	OldHorizon messages.HLC
	// Bound is the lower HLC bound reconciliation settled with the peer:
	// the peer's own horizon when above zero. History below it was not
	// available from this peer.
	Bound messages.HLC
	// Sessions are the reconciliation sessions run; Fetched the events
	// received and applied through the chokepoint.
	Sessions, Fetched int
	// Completed are the keys of the rows whose resurrection rebuild the
	// old horizon had bounded (a tombstone below it) and which now hold
	// the history from their tombstone up: each was surfaced as a
	// messages.RebuildCompleted notice.
	Completed []messages.Columns
	// StillPartial counts such rows whose tombstone lies below Bound (the
	// peer evicted that history too).
	StillPartial int
}

// bounded is a row a rebuild may have left partial: it exists over a
// tombstone below the horizon (SSP/1 §13.4).
type bounded struct {
	key  messages.Columns
	tomb messages.Clock
}

// Rehydrate drops the eviction horizon of schema.table to zero and takes
// the table's history below the old horizon back from peer (added with
// AddPeer), by reconciliation of that one table from HLC zero: every event
// it fetches goes through the apply chokepoint like any push (signature,
// skew, scope, idempotent insert; SSP/1 §12), and applying it writes the
// cells it wins, which is what a complete rebuild computes. Rows whose
// resurrection rebuild the old horizon had bounded (SSP/1 §13.4, a
// PartialRebuild) and whose history the peer held are surfaced as
// complete: listed in the report and notified as messages.RebuildCompleted.
// History the peer evicted too (below its horizon, RehydrateReport.Bound)
// cannot come back from it; those rows are counted as StillPartial.
// Rehydrate never touches a cursor or a watermark (§14.1).
func (n *Node) Rehydrate(ctx context.Context, schema, table, peer string) (RehydrateReport, error) {
	rep := RehydrateReport{Peer: peer, Schema: schema, Table: table}
	if n.isClosed() {
		return rep, ErrClosed
	}
	if !n.reconScope().Contains(schema, table) {
		return rep, fmt.Errorf("%w: %s.%s", ErrOutOfScope, schema, table)
	}
	t, ok := n.recon.transport(peer)
	if !ok {
		return rep, fmt.Errorf("%w: %s", ErrUnknownPeer, peer)
	}
	rt, ok := t.(reconcileTransport)
	if !ok {
		return rep, fmt.Errorf("%w: %s", ErrReconcileUnsupported, peer)
	}
	release, err := n.recon.turn(ctx, peer)
	if err != nil {
		return rep, err
	}
	defer release()
	rows, err := n.lowerHorizon(ctx, schema, table, &rep)
	if err != nil {
		return rep, err
	}
	g := reconcile.Group{Schema: schema, Table: table}
	gen := n.recon.generation() // before anything is fetched
	rr := ReconcileReport{Peer: peer, Outcomes: map[messages.OutcomeKind]int{}}
	complete := false
	for rep.Sessions < maxRehydrateSessions {
		rep.Sessions++
		need, bound, truncated, answered, err := n.rehydrateSession(ctx, rt, peer, g, &rr)
		if err != nil {
			return rep, err
		}
		if !answered && rep.Sessions == 1 {
			// Silence is not agreement: a peer that leaves the table out
			// of its answers compared nothing.
			return rep, fmt.Errorf("%w: %s.%s from %s", ErrRehydrateNotServed, schema, table, peer)
		}
		rep.Bound = bound
		if len(need) == 0 && !truncated {
			complete = true
			break
		}
		before := rr.Fetched
		for len(need) > 0 {
			chunk := need[:min(len(need), messages.MaxReconcileKeys)]
			need = need[len(chunk):]
			if err := n.fetchMissing(ctx, rt, peer, gen, g, chunk, &rr, &fetchSession{}); err != nil {
				rep.Fetched = rr.Fetched
				return rep, err
			}
		}
		rep.Fetched = rr.Fetched
		if rr.Fetched == before && !truncated {
			break // the peer serves nothing more of what it lists
		}
	}
	if !complete {
		return rep, fmt.Errorf("%w: %s.%s from %s after %d sessions", ErrRehydrateIncomplete, schema, table, peer, rep.Sessions)
	}
	for _, r := range rows {
		if r.tomb.HLC < rep.Bound {
			rep.StillPartial++
			continue
		}
		rep.Completed = append(rep.Completed, r.key)
		n.publish(messages.RebuildCompleted{Schema: schema, Table: table, Key: r.key, Tomb: r.tomb, Horizon: rep.OldHorizon})
	}
	n.log.Info("rehydrated", "table", schema+"."+table, "peer", peer, "old_horizon", rep.OldHorizon,
		"fetched", rep.Fetched, "completed", len(rep.Completed), "still_partial", rep.StillPartial)
	return rep, nil
}

// lowerHorizon sets the table's horizon to zero and returns the rows a
// rebuild under the old horizon may have left partial, in one transaction
// (a write racing it sees either the old horizon or zero, never a mix).
func (n *Node) lowerHorizon(ctx context.Context, schema, table string, rep *RehydrateReport) ([]bounded, error) {
	var rows []bounded
	err := n.router.Write(ctx, func(tx persistence.SyncTx) error { // the committer: one writer
		rows = rows[:0]
		t, _, err := requireTable(tx, schema, table)
		if err != nil {
			return err
		}
		if rep.OldHorizon, err = tx.Horizon(t); err != nil {
			return err
		}
		if rep.OldHorizon == 0 {
			return nil
		}
		if err := tx.Rows(t, nil, func(_ []byte, r persistence.Row) (bool, error) {
			if r.Exists && !r.Tomb.IsZero() && r.Tomb.HLC < rep.OldHorizon {
				rows = append(rows, bounded{key: r.Key, tomb: r.Tomb})
			}
			return true, ctx.Err()
		}); err != nil {
			return err
		}
		return tx.SetHorizon(t, 0)
	})
	return rows, err
}

// rehydrateSession reconciles the one group g with peer and returns the
// keys the peer holds and this node lacks, with the bound the session
// settled; answered says whether the peer answered for g at all (a peer
// that does not sync the table leaves it out).
func (n *Node) rehydrateSession(ctx context.Context, rt reconcileTransport, peer string, g reconcile.Group, rep *ReconcileReport) (need []reconcile.Key, bound messages.HLC, truncated, answered bool, err error) {
	src := &nodeSource{ctx: ctx, n: n, peer: peer, scope: n.reconScope()}
	sess, err := n.reconcileRounds(ctx, rt, peer, src, []reconcile.Group{g}, rep, func(ig messages.ReconcileGroup) {
		answered = answered || (ig.Schema == g.Schema && ig.Table == g.Table)
	})
	if err != nil {
		return nil, 0, false, false, err
	}
	bound, _ = sess.Bound(g)
	for _, f := range sess.Found() {
		if f.Group == g {
			need = append(need, f.Need...)
		}
	}
	return need, bound, sess.Truncated(), answered, nil
}
