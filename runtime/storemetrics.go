package runtime

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/persistence"
)

// storage transaction latency, per plane and kind (docs/architecture.md, "Costs": bbolt
// transaction latency is a first-class metric: a slow disk shows here
// before it shows anywhere else).
func newTxLatency(reg prometheus.Registerer) (*prometheus.HistogramVec, error) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "syncmesh", Subsystem: "storage", Name: "tx_seconds",
		Help:    "Storage transaction latency (commit and fsync included for updates), by plane and kind.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	}, []string{"plane", "kind"})
	return promreg.Register(reg, h)
}

type timedSync struct {
	persistence.SyncStore
	update, view prometheus.Observer
}

func (s timedSync) Update(ctx context.Context, fn func(tx persistence.SyncTx) error) error {
	start := time.Now()
	err := s.SyncStore.Update(ctx, fn)
	s.update.Observe(time.Since(start).Seconds())
	return err
}

func (s timedSync) View(ctx context.Context, fn func(tx persistence.SyncReader) error) error {
	start := time.Now()
	err := s.SyncStore.View(ctx, fn)
	s.view.Observe(time.Since(start).Seconds())
	return err
}

type timedDelivery struct {
	persistence.DeliveryStore
	update, view prometheus.Observer
}

func (s timedDelivery) Update(ctx context.Context, fn func(tx persistence.DeliveryTx) error) error {
	start := time.Now()
	err := s.DeliveryStore.Update(ctx, fn)
	s.update.Observe(time.Since(start).Seconds())
	return err
}

func (s timedDelivery) View(ctx context.Context, fn func(tx persistence.DeliveryReader) error) error {
	start := time.Now()
	err := s.DeliveryStore.View(ctx, fn)
	s.view.Observe(time.Since(start).Seconds())
	return err
}
