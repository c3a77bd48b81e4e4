package pingreq

import "github.com/prometheus/client_golang/prometheus"

// GuardCollector exposes a Guard's counters to Prometheus, read at scrape
// time.
type GuardCollector struct {
	guard              *Guard
	connectTimeouts    *prometheus.Desc
	refusedConnections *prometheus.Desc
	droppedQoS0        *prometheus.Desc
	closedSlow         *prometheus.Desc
}

// Collector returns a Prometheus collector for the guard's counters.
func (g *Guard) Collector() *GuardCollector {
	return &GuardCollector{
		guard: g,
		connectTimeouts: prometheus.NewDesc("luffymq_connect_timeouts_total",
			"Connections closed because their CONNECT packet was not complete within the connect timeout.", nil, nil),
		refusedConnections: prometheus.NewDesc("luffymq_connections_refused_total",
			"Connections closed at accept because a connection limit was reached, by limit (listener, ip).", []string{"limit"}, nil),
		droppedQoS0: prometheus.NewDesc("luffymq_qos0_dropped_total",
			"QoS 0 publishes dropped because the receiving client's outbox was full (it reads too slowly), by reason.", []string{"reason"}, nil),
		closedSlow: prometheus.NewDesc("luffymq_slow_clients_disconnected_total",
			"Clients disconnected because they did not read what the broker sent, by reason (write_timeout, outbox_full).", []string{"reason"}, nil),
	}
}

// Describe sends the descriptors of every metric.
func (c *GuardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connectTimeouts
	ch <- c.refusedConnections
	ch <- c.droppedQoS0
	ch <- c.closedSlow
}

// Collect sends the current values.
func (c *GuardCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.guard.Stats()
	ch <- prometheus.MustNewConstMetric(c.connectTimeouts, prometheus.CounterValue, float64(s.ConnectTimeouts))
	ch <- prometheus.MustNewConstMetric(c.refusedConnections, prometheus.CounterValue, float64(s.RefusedListenerLimit), "listener")
	ch <- prometheus.MustNewConstMetric(c.refusedConnections, prometheus.CounterValue, float64(s.RefusedIPLimit), "ip")
	o := &c.guard.Outbox
	ch <- prometheus.MustNewConstMetric(c.droppedQoS0, prometheus.CounterValue, float64(o.DroppedQoS0.Load()), "outbox_full")
	ch <- prometheus.MustNewConstMetric(c.closedSlow, prometheus.CounterValue, float64(o.WriteTimeouts.Load()), "write_timeout")
	ch <- prometheus.MustNewConstMetric(c.closedSlow, prometheus.CounterValue, float64(o.OutboxFull.Load()), "outbox_full")
}
