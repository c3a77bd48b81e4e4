package broker

import (
	"strings"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/luffymq/luffymq/hooks"
)

// metricsRegistry returns a registry of every metric the broker exports at
// GET /metrics (see metricsCollectors).
func (b *Broker) metricsRegistry() *prometheus.Registry {
	registry := prometheus.NewRegistry()
	registry.MustRegister(b.metricsCollectors()...)
	return registry
}

// metricsCollectors returns the collectors of every metric the broker
// exports: Mochi's counters and state, connection hygiene, selection and
// load reports, topic rules, the bridge when it is on, and the Go runtime
// and process collectors. Everything is read at scrape time.
func (b *Broker) metricsCollectors() []prometheus.Collector {
	cs := []prometheus.Collector{
		hooks.NewMetricsCollector(b.selection, hooks.MetricsOptions{MaxMembers: b.cfg.MetricsMaxMembers}),
		newServerInfoCollector(b.server),
		newServerStateCollector(b.server, b.connections),
		b.guard.Collector(),
		hooks.NewTopicRulesCollector(b.topicRules),
		hooks.NewReconnectOrderCollector(b.reconnect),
		hooks.NewTakeoverCollector(b.takeover),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	if b.bridge != nil {
		cs = append(cs, b.bridge.Collector())
	}
	if b.pacing != nil {
		cs = append(cs, hooks.NewPacingCollector(b.pacing))
	}
	return cs
}

// serverStateCollector exposes the Mochi counters and state that
// serverInfoCollector leaves out: bytes and packets, sessions, retained
// messages, subscriptions, the connection peak, and the connections
// accepted. Everything is read when scraped.
type serverStateCollector struct {
	server      *mqtt.Server
	connections *hooks.ConnectionCounterHook

	receivedBytes, sentBytes, receivedPackets, sentPackets *prometheus.Desc
	accepted, peak, sessions, retained, subscriptions      *prometheus.Desc
}

func newServerStateCollector(s *mqtt.Server, connections *hooks.ConnectionCounterHook) *serverStateCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &serverStateCollector{
		server:      s,
		connections: connections,
		receivedBytes: d("luffymq_received_bytes_total",
			"Bytes of MQTT packets received from clients."),
		sentBytes: d("luffymq_sent_bytes_total",
			"Bytes of MQTT packets sent to clients."),
		receivedPackets: d("luffymq_packets_received_total",
			"MQTT packets of any type received from clients."),
		sentPackets: d("luffymq_packets_sent_total",
			"MQTT packets of any type sent to clients."),
		accepted: d("luffymq_connections_accepted_total",
			"MQTT connections accepted (CONNACK with success) since the broker started."),
		peak: d("luffymq_clients_connected_peak",
			"Most MQTT clients connected at once since the broker started."),
		sessions: d("luffymq_sessions",
			"Client sessions the broker holds: connected clients and disconnected ones whose session has not expired."),
		retained: d("luffymq_retained_messages",
			"Retained messages held for clients (Mochi's own $SYS topics not counted)."),
		subscriptions: d("luffymq_subscriptions",
			"Subscriptions held, shared ones included, of connected clients and surviving sessions."),
	}
}

// Describe sends the descriptors of every metric.
func (c *serverStateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.receivedBytes, c.sentBytes, c.receivedPackets, c.sentPackets,
		c.accepted, c.peak, c.sessions, c.retained, c.subscriptions} {
		ch <- d
	}
}

// Collect sends the current values.
func (c *serverStateCollector) Collect(ch chan<- prometheus.Metric) {
	info := c.server.Info
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(c.receivedBytes, atomic.LoadInt64(&info.BytesReceived))
	counter(c.sentBytes, atomic.LoadInt64(&info.BytesSent))
	counter(c.receivedPackets, atomic.LoadInt64(&info.PacketsReceived))
	counter(c.sentPackets, atomic.LoadInt64(&info.PacketsSent))
	ch <- prometheus.MustNewConstMetric(c.accepted, prometheus.CounterValue, float64(c.connections.Accepted.Load()))
	gauge(c.peak, atomic.LoadInt64(&info.ClientsMaximum))
	sessions := int64(c.server.Clients.Len())
	if _, ok := c.server.Clients.Get(mqtt.InlineClientId); ok {
		sessions-- // the bridge's in-process client is no session
	}
	gauge(c.sessions, sessions)
	// Mochi retains its own $SYS topics alongside the clients' messages.
	// Count from a copy of the retained store, taken under its lock:
	// Topics.Messages walks the topic tree without locks and raced with
	// Mochi's own $SYS publishing (seen under -race in CI).
	retained := 0
	for topic := range c.server.Topics.Retained.GetAll() {
		if !strings.HasPrefix(topic, mqtt.SysPrefix+"/") {
			retained++
		}
	}
	gauge(c.retained, int64(retained))
	gauge(c.subscriptions, atomic.LoadInt64(&info.Subscriptions))
}
