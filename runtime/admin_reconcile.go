package runtime

import (
	"context"
	"net/http"
	"time"

	"github.com/syncmesh/syncmesh/actors/reconcile"
)

// ReconcileSummary is one reconciliation as the admin endpoint reports it:
// in /admin/peers (the last one with each peer) and as the answer of
// POST /admin/reconcile.
type ReconcileSummary struct {
	Peer   string    `json:"peer"`
	At     time.Time `json:"at"`
	TookMS float64   `json:"took_ms"`
	// Result is "ok" or "error" (then Error says why).
	Result        string `json:"result"`
	Error         string `json:"error,omitempty"`
	RoundTrips    int    `json:"round_trips"`
	BytesSent     int    `json:"bytes_sent"`
	BytesReceived int    `json:"bytes_received"`
	// EventsMissing were found held by the peer and lacking here;
	// EventsFetched were received for them and went through apply.
	EventsMissing int `json:"events_missing"`
	EventsFetched int `json:"events_fetched"`
	// PeerLacks (POST only) counts the events the peer lacks; it fetches
	// them when it reconciles with this node.
	PeerLacks int `json:"peer_lacks,omitempty"`
	// Truncated (POST only): the session stopped at its bound of found
	// keys; the next one continues.
	Truncated bool `json:"truncated,omitempty"`
}

func reconcileSummary(peer string, st reconcile.Status) *ReconcileSummary {
	if st.At.IsZero() {
		return nil
	}
	s := &ReconcileSummary{Peer: peer, At: st.At, TookMS: float64(st.Took.Microseconds()) / 1000, Result: "ok",
		RoundTrips: st.Rounds, BytesSent: st.BytesSent, BytesReceived: st.BytesReceived,
		EventsMissing: st.Missing, EventsFetched: st.Fetched}
	if st.Err != nil {
		s.Result, s.Error = "error", st.Err.Error()
	}
	return s
}

// adminReconcileRoute serves POST /admin/reconcile?peer=NAME: one
// reconciliation with peer now (Node.Reconcile), with the bearer token
// like every state-changing action.
func (n *Node) adminReconcileRoute(mux *http.ServeMux) {
	mux.HandleFunc("/admin/reconcile", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if !n.authorized(w, r) {
			return
		}
		peer := r.URL.Query().Get("peer")
		if peer == "" {
			http.Error(w, "peer is required", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Minute)
		defer cancel()
		start := time.Now()
		rep, err := n.Reconcile(ctx, peer)
		if err != nil {
			n.writeJSON(w, nil, err)
			return
		}
		s := reconcileSummary(peer, reconcile.Status{At: time.Now(), Took: time.Since(start), Rounds: rep.Rounds,
			BytesSent: rep.BytesSent, BytesReceived: rep.BytesReceived, Missing: rep.Missing, Fetched: rep.Fetched})
		s.PeerLacks, s.Truncated = rep.PeerLacks, rep.Truncated
		n.writeJSON(w, s, nil)
	})
}
