package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterSharesAndRefusesConflicts(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	a, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil || a != b {
		t.Fatalf("second registration: %v, same collector %v", err, a == b)
	}
	if _, err := Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "other"})); err == nil {
		t.Fatal("a conflicting collector was accepted")
	}
	if c, err := Register[prometheus.Counter](nil, a); err != nil || c != a {
		t.Fatal("nil registry")
	}
}
