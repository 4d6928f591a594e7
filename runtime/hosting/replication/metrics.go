package replication

import "github.com/prometheus/client_golang/prometheus"

// collector exports Stats to Prometheus (Config.Registerer): what an
// operator watches to see partitions without a leader here, refused
// members and replicas that fell behind.
type collector struct {
	e                                        *Engine
	running, leading, units, catchingUp      *prometheus.Desc
	refused, snapshots, restores, applyError *prometheus.Desc
}

func newCollector(e *Engine) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("syncmesh_replication_"+name, help, nil, nil)
	}
	return &collector{
		e:          e,
		running:    d("partitions_running", "Partitions with a raft group on this member."),
		leading:    d("partitions_leading", "Partitions this member leads."),
		units:      d("units", "Unit replicas on this member."),
		catchingUp: d("partitions_catching_up", "Partitions started here with no raft state that do not vote yet (not caught up)."),
		refused:    d("refused_connections_total", "Replication connections refused: the certificate names no current member."),
		snapshots:  d("snapshots_total", "Partition snapshots taken by this member."),
		restores:   d("restores_total", "Partition snapshots installed on this member (replicas rebuilt)."),
		applyError: d("apply_errors_total", "Log entries that failed to apply on this member."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.leading, c.units, c.catchingUp, c.refused, c.snapshots, c.restores, c.applyError} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(c.leading, prometheus.GaugeValue, float64(st.Leading))
	ch <- prometheus.MustNewConstMetric(c.units, prometheus.GaugeValue, float64(st.Units))
	ch <- prometheus.MustNewConstMetric(c.catchingUp, prometheus.GaugeValue, float64(st.CatchingUp))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.RefusedConnections))
	ch <- prometheus.MustNewConstMetric(c.snapshots, prometheus.CounterValue, float64(st.Snapshots))
	ch <- prometheus.MustNewConstMetric(c.restores, prometheus.CounterValue, float64(st.Restores))
	ch <- prometheus.MustNewConstMetric(c.applyError, prometheus.CounterValue, float64(st.ApplyErrors))
}
