package runtime

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/persistence"
)

// Operating a running node.
//
// With Config.MetricsAddr the node serves, beside /metrics and /healthz, a
// read-only JSON admin endpoint:
//
//	GET /admin/status      Status: identity, clock, log, tables, peer count, pending messages
//	GET /admin/peers       []PeerReport: cursor, backlog and lag in events and time, last error
//	GET /admin/watermarks  []WatermarkReport: this node's applied watermarks
//	GET /admin/inbound     []InboundReport: how far each sender's pushes reached here
//	GET /admin/messages    MessageCounts: pending inbound and outbound messages
//	GET /admin/held        []HeldReport: groups held for a missing table, with count and age
//	GET /admin/pending     PendingReportPage: received messages pending the application's
//	                       commit (ids, sender, age, deliveries; ?after=SEQ&limit=N, N ≤ 100)
//
// Nothing there changes state. Actions that do, and the backup, are off unless
// Config.AdminToken is set, and then need "Authorization: Bearer <token>":
//
//	POST /admin/sync?peer=NAME[&path=PATH]  run one push cycle now (SyncNow)
//	POST /admin/reconcile?peer=NAME         reconcile with peer now (Reconcile)
//	GET  /admin/backup                      an online consistent copy of node.db (Backup)
//
// Without a token they answer 403 Forbidden, with a wrong or missing one
// 401 Unauthorized. The listener is plain HTTP: bind it to loopback or a
// management network. The same reports are available in code (Status,
// PeerReports).

// Status is a node's summary as /admin/status reports it.
type Status struct {
	Name    string `json:"name"`
	Site    string `json:"site"`
	Kid     string `json:"kid"`
	MeshID  string `json:"mesh_id"`
	Clock   string `json:"clock"`
	LastSeq uint64 `json:"last_seq"`
	Tables  int    `json:"tables"`
	Trusted int    `json:"trusted_keys"`
	Peers   int    `json:"peers"`
	// BacklogEvents sums the peers' backlogs and re-offers.
	BacklogEvents uint64 `json:"backlog_events"`
	Remote        string `json:"remote,omitempty"`
	// Device is the node's device address, empty without a delivery plane.
	Device   string         `json:"device,omitempty"`
	Messages *MessageCounts `json:"messages,omitempty"`
	// HeldGroups counts the groups whose events wait for a table this node
	// has not defined (listed by /admin/held).
	HeldGroups int `json:"held_groups"`
	// Restore is the restore check of the last Open.
	Restore RestoreReport `json:"restore"`
}

// PeerReport is one peer and path as /admin/peers reports it: how far
// behind the peer is, in events (what this node still has to offer it) and
// in time (how far its reported watermarks trail this node's, worst group).
type PeerReport struct {
	Peer   string `json:"peer"`
	Path   string `json:"path"`
	Cursor uint64 `json:"cursor"`
	Tail   uint64 `json:"tail"`
	// Tail is the local log's last sequence (now, or at the sender's last
	// cycle if that is later); BacklogEvents is Tail − Cursor: log entries
	// not offered to the peer yet.
	BacklogEvents uint64 `json:"backlog_events"`
	// RetryEvents are offered events waiting to be offered again.
	RetryEvents int `json:"retry_events"`
	// LagEvents is BacklogEvents + RetryEvents: read it first. A joiner
	// far behind has a time lag of 0 until it reports a watermark.
	LagEvents uint64 `json:"lag_events"`
	// LagMS is the worst group's distance between this node's watermark
	// and the peer's, over the groups the peer reported one for.
	LagMS int64 `json:"lag_ms"`
	// GroupsWithoutWatermark counts this node's groups the peer reported
	// no watermark for (time lag unknown there).
	GroupsWithoutWatermark int       `json:"groups_without_watermark"`
	LastPush               time.Time `json:"last_push,omitzero"`
	LastError              string    `json:"last_error,omitempty"`
	// LastReconcile is the last reconciliation this node started with
	// the peer; absent: none yet.
	LastReconcile *ReconcileSummary `json:"last_reconcile,omitempty"`
}

// WatermarkReport is one applied watermark (SSP/1 §14.2).
type WatermarkReport struct {
	Site   string `json:"site"`
	Schema string `json:"schema"`
	Table  string `json:"table"`
	HLC    string `json:"hlc"`
	// Raw is the packed HLC.
	Raw uint64 `json:"hlc_raw"`
}

// InboundReport is what one sender's pushes reached here.
type InboundReport struct {
	From    string    `json:"from"`
	Through uint64    `json:"through"`
	Tail    uint64    `json:"tail"`
	Applied uint64    `json:"applied"`
	Gaps    int       `json:"gaps"`
	At      time.Time `json:"at,omitzero"`
}

// MessageCounts are the delivery plane's pending messages.
type MessageCounts struct {
	// PendingInbound: received, waiting for the application to commit or
	// discard.
	PendingInbound int `json:"pending_inbound_messages"`
	// PendingOutbound: sent, waiting for the recipient's ACK.
	PendingOutbound int `json:"pending_outbound_messages"`
}

// PeerReports returns every peer's status with its lag in events and in
// time.
func (n *Node) PeerReports(ctx context.Context) ([]PeerReport, error) {
	peers, err := n.Peers(ctx)
	if err != nil {
		return nil, err
	}
	ours, err := n.Watermarks(ctx)
	if err != nil {
		return nil, err
	}
	// A sender learns the tail at its cycles; the log may have grown since.
	last, err := n.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]PeerReport, 0, len(peers))
	for _, p := range peers {
		r := PeerReport{Peer: p.Peer, Path: p.Path, Cursor: p.Cursor, Tail: max(p.Tail, last), RetryEvents: p.Retry, LastPush: p.LastPush,
			LastReconcile: reconcileSummary(p.Peer, reconcile.Status(p.LastReconcile))}
		if r.Tail > p.Cursor {
			r.BacklogEvents = r.Tail - p.Cursor
		}
		r.LagEvents = r.BacklogEvents + uint64(max(p.Retry, 0))
		if p.LastErr != nil {
			r.LastError = p.LastErr.Error()
		}
		for _, w := range ours {
			theirs, ok := p.Watermarks[w.Group]
			if !ok || theirs == 0 {
				r.GroupsWithoutWatermark++
				continue
			}
			if d := int64(w.HLC.Physical()) - int64(theirs.Physical()); d > r.LagMS {
				r.LagMS = d
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// Status returns the node's summary (what /admin/status serves).
func (n *Node) Status(ctx context.Context) (Status, error) {
	if n.isClosed() {
		return Status{}, ErrClosed
	}
	id := n.Identity()
	st := Status{Name: n.name, Site: id.Site.String(), Kid: hex.EncodeToString(id.Kid), MeshID: hex.EncodeToString(id.MeshID),
		Clock: n.Clock().String(), Trusted: len(n.TrustedKeys())}
	if err := n.store.View(ctx, func(tx persistence.SyncReader) error {
		var err error
		if st.LastSeq, err = tx.LastSeq(); err != nil {
			return err
		}
		defs, err := tx.Tables()
		if err != nil {
			return err
		}
		st.Tables = len(defs)
		held, err := tx.HeldGroups()
		st.HeldGroups = len(held)
		return err
	}); err != nil {
		return Status{}, err
	}
	st.Restore = n.restoreReport()
	peers, err := n.PeerReports(ctx)
	if err != nil {
		return Status{}, err
	}
	st.Peers = len(peers)
	for _, p := range peers {
		st.BacklogEvents += p.LagEvents
	}
	if n.remote != nil {
		st.Remote = n.remote.Address()
	}
	if n.device != nil {
		st.Device = n.DeviceAddress().String()
		mc, err := n.messageCounts(ctx)
		if err != nil {
			return Status{}, err
		}
		st.Messages = &mc
	}
	return st, nil
}

func (n *Node) messageCounts(ctx context.Context) (MessageCounts, error) {
	var mc MessageCounts
	if n.dstore == nil {
		return mc, ErrNoDevice
	}
	err := n.dstore.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		if mc.PendingInbound, err = r.PendingInboundCount(nil); err != nil {
			return err
		}
		mc.PendingOutbound, err = r.PendingOutboundCount()
		return err
	})
	return mc, err
}

func (n *Node) adminRoutes(mux *http.ServeMux) {
	get := func(path string, fn func(ctx context.Context) (any, error)) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "read-only", http.StatusMethodNotAllowed)
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
			defer cancel()
			v, err := fn(ctx)
			n.writeJSON(w, v, err)
		})
	}
	get("/admin/status", func(ctx context.Context) (any, error) { return n.Status(ctx) })
	get("/admin/peers", func(ctx context.Context) (any, error) { return n.PeerReports(ctx) })
	get("/admin/held", func(ctx context.Context) (any, error) {
		r, _, err := n.HeldReports(ctx)
		return r, err
	})
	get("/admin/watermarks", func(ctx context.Context) (any, error) {
		ws, err := n.Watermarks(ctx)
		out := make([]WatermarkReport, 0, len(ws))
		for _, w := range ws {
			out = append(out, WatermarkReport{Site: w.Group.Site.String(), Schema: w.Group.Schema, Table: w.Group.Table, HLC: w.HLC.String(), Raw: uint64(w.HLC)})
		}
		return out, err
	})
	get("/admin/inbound", func(ctx context.Context) (any, error) {
		in, err := n.Inbound(ctx)
		out := make([]InboundReport, 0, len(in))
		for _, i := range in {
			out = append(out, InboundReport(i))
		}
		return out, err
	})
	get("/admin/messages", func(ctx context.Context) (any, error) { return n.messageCounts(ctx) })
	n.adminReconcileRoute(mux) // admin_reconcile.go
	n.adminPendingRoute(mux)   // admin_pending.go
	n.adminBackupRoute(mux)    // admin_backup.go
	mux.HandleFunc("/admin/sync", func(w http.ResponseWriter, r *http.Request) {
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
		rep, err := n.SyncNow(r.Context(), peer, r.URL.Query().Get("path"))
		if err == nil && rep.Err != nil {
			err = rep.Err
		}
		n.writeJSON(w, map[string]any{"peer": peer, "offered": rep.Offered, "through": rep.Through, "tail": rep.Tail}, err)
	})
}

// authorized checks the bearer token of a state-changing request: refused
// outright when no Config.AdminToken is configured.
func (n *Node) authorized(w http.ResponseWriter, r *http.Request) bool {
	if n.cfg.AdminToken == "" {
		http.Error(w, "state-changing admin actions are off (Config.AdminToken is not set)", http.StatusForbidden)
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(n.cfg.AdminToken)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="syncmesh admin"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return false
	}
	return true
}

func (n *Node) writeJSON(w http.ResponseWriter, v any, err error) {
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrClosed):
			code = http.StatusServiceUnavailable
		case errors.Is(err, ErrNoDevice):
			code = http.StatusNotFound
		case errors.Is(err, ErrUnknownPeer):
			code = http.StatusNotFound
		case errors.Is(err, ErrInvalidAdminQuery):
			code = http.StatusBadRequest
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		n.log.Warn("runtime: admin: encode", "err", err)
	}
}
