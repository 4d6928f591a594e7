package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/syncmesh/syncmesh/persistence"
)

// startHTTP serves the node's Prometheus metrics on /metrics, its health
// on /healthz and the admin endpoint under /admin/ (Config.MetricsAddr;
// admin.go).
func (n *Node) startHTTP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &ConfigError{"MetricsAddr", err.Error()}
	}
	mux := http.NewServeMux()
	if n.gather != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(n.gather, promhttp.HandlerOpts{ErrorLog: slogPrinter{n}}))
	} else {
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "metrics go to Config.Registerer, which is not a prometheus.Gatherer: serve them from your registry", http.StatusNotImplemented)
		})
	}
	mux.HandleFunc("/healthz", n.serveHealth)
	n.adminRoutes(mux)
	n.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	n.httpAddr = ln.Addr().String()
	go func() {
		if err := n.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("runtime: metrics listener stopped", "err", err)
		}
	}()
	return nil
}

type slogPrinter struct{ n *Node }

func (p slogPrinter) Println(v ...any) { p.n.log.Warn("runtime: metrics: " + fmt.Sprint(v...)) }

// serveHealth answers 200 while the node is open, its storage answers a
// read within a second and its wall clock is not behind its clock mark by
// more than the skew bound (local writes would be refused), 503 otherwise.
func (n *Node) serveHealth(w http.ResponseWriter, r *http.Request) {
	if n.isClosed() {
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := n.store.View(ctx, func(tx persistence.SyncReader) error { _, err := tx.LastSeq(); return err }); err != nil {
		http.Error(w, "storage: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	if err := n.clockHealth(); err != nil { // restore.go: local writes refused
		http.Error(w, "clock: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprintln(w, "ok")
}

// MetricsAddr returns the address the metrics and health listener is
// bound to (Config.MetricsAddr with its real port), or "" without one.
func (n *Node) MetricsAddr() string { return n.httpAddr }

func (n *Node) stopHTTP() error {
	if n.httpSrv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return n.httpSrv.Shutdown(ctx)
}
