package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/syncmesh/syncmesh/persistence"
)

// MaxPendingReportPage bounds one page of PendingReports (and of
// /admin/pending): the work of a request is bounded whatever it asks for.
const MaxPendingReportPage = 100

// ErrInvalidAdminQuery is returned for an admin request whose query is
// malformed or out of range (the endpoint answers 400 Bad Request).
var ErrInvalidAdminQuery = errors.New("runtime: invalid admin query")

// PendingReport is one received message waiting for the application to
// commit or discard it (docs/protocol.md, commit boundary), as
// /admin/pending reports it. It carries metadata only: never the body.
type PendingReport struct {
	Sender string `json:"sender"`
	ID     string `json:"id"`
	// Sequence is the message's receive sequence: the page cursor.
	Sequence   uint64    `json:"sequence"`
	ReceivedAt time.Time `json:"received_at"`
	// AgeSeconds is how long before now the message was accepted.
	AgeSeconds float64 `json:"age_seconds"`
	// Deliveries counts the hand-offs to the application so far, across
	// restarts.
	Deliveries uint32 `json:"deliveries"`
	// FrameBytes is the size of the stored application frame (the body
	// and its framing).
	FrameBytes int `json:"frame_bytes"`
}

// PendingReportPage is one page of PendingReports in receive order. Next
// is the cursor of the following page (?after=Next); More reports whether
// more messages follow; Total counts every pending message.
type PendingReportPage struct {
	Messages []PendingReport `json:"messages"`
	Next     uint64          `json:"next"`
	More     bool            `json:"more"`
	Total    int             `json:"total"`
}

// PendingReports pages the received messages pending the application's
// commit after the receive sequence after, at most limit
// (1..MaxPendingReportPage) of them. It never returns a body (the store
// opens each frame of the page; nothing past the page is read). It
// returns ErrNoDevice without a delivery plane.
//
// Deprecated: use PendingReceivedReports, which returns an iter.Seq2 like
// every listing (this page form is what /admin/pending serves).
func (n *Node) PendingReports(ctx context.Context, after uint64, limit int) (PendingReportPage, error) {
	if n.isClosed() {
		return PendingReportPage{}, ErrClosed
	}
	if n.dstore == nil {
		return PendingReportPage{}, ErrNoDevice
	}
	if limit < 1 || limit > MaxPendingReportPage {
		return PendingReportPage{}, fmt.Errorf("%w: limit %d (1..%d)", ErrInvalidAdminQuery, limit, MaxPendingReportPage)
	}
	now := n.cfg.Wall()
	page := PendingReportPage{Messages: []PendingReport{}, Next: after}
	err := n.dstore.View(ctx, func(r persistence.DeliveryReader) error {
		var err error
		if page.Total, err = r.PendingInboundCount(nil); err != nil {
			return err
		}
		return r.PendingInboundAfter(after, nil, func(p persistence.PendingInbound) (bool, error) {
			if len(page.Messages) == limit {
				page.More = true
				return false, nil
			}
			at := time.UnixMilli(p.ReceivedAt)
			page.Messages = append(page.Messages, PendingReport{Sender: p.Sender.String(), ID: p.ID.String(), Sequence: p.Sequence,
				ReceivedAt: at, AgeSeconds: max(0, now.Sub(at).Seconds()), Deliveries: p.Deliveries, FrameBytes: len(p.Frame)})
			page.Next = p.Sequence
			return true, nil
		})
	})
	if err != nil {
		return PendingReportPage{}, err
	}
	return page, nil
}

// adminPendingRoute serves GET /admin/pending[?after=SEQ][&limit=N].
func (n *Node) adminPendingRoute(mux *http.ServeMux) {
	mux.HandleFunc("/admin/pending", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "read-only", http.StatusMethodNotAllowed)
			return
		}
		after, limit, err := pendingQuery(r.URL.Query())
		if err != nil {
			n.writeJSON(w, nil, err)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		page, err := n.PendingReports(ctx, after, limit)
		n.writeJSON(w, page, err)
	})
}

func pendingQuery(q url.Values) (after uint64, limit int, err error) {
	limit = MaxPendingReportPage
	if s := q.Get("after"); s != "" {
		if after, err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("%w: after %q", ErrInvalidAdminQuery, s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil {
			return 0, 0, fmt.Errorf("%w: limit %q", ErrInvalidAdminQuery, s)
		}
	}
	return after, limit, nil
}
