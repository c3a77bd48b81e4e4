package broker

import (
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// serverInfoCollector exposes Mochi's own counters (its $SYS values).
type serverInfoCollector struct {
	server *mqtt.Server
	descs  []serverInfoMetric
}

type serverInfoMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s *mqtt.Server) int64
}

func newServerInfoCollector(s *mqtt.Server) *serverInfoCollector {
	metric := func(name, help string, kind prometheus.ValueType, v func(s *mqtt.Server) int64) serverInfoMetric {
		return serverInfoMetric{desc: prometheus.NewDesc(name, help, nil, nil), kind: kind, value: v}
	}
	return &serverInfoCollector{server: s, descs: []serverInfoMetric{
		metric("luffymq_clients_connected", "Connected MQTT clients.", prometheus.GaugeValue,
			func(s *mqtt.Server) int64 { return atomic.LoadInt64(&s.Info.ClientsConnected) }),
		metric("luffymq_messages_received_total", "PUBLISH packets received from clients.", prometheus.CounterValue,
			func(s *mqtt.Server) int64 { return atomic.LoadInt64(&s.Info.MessagesReceived) }),
		metric("luffymq_messages_sent_total", "PUBLISH packets sent to clients.", prometheus.CounterValue,
			func(s *mqtt.Server) int64 { return atomic.LoadInt64(&s.Info.MessagesSent) }),
		metric("luffymq_messages_dropped_total", "Messages dropped because a client's write queue was full.", prometheus.CounterValue,
			func(s *mqtt.Server) int64 { return atomic.LoadInt64(&s.Info.MessagesDropped) }),
		metric("luffymq_inflight_messages", "QoS 1/2 messages in flight: sent or queued for a session and not yet acknowledged.", prometheus.GaugeValue,
			sessionsInflight),
		metric("luffymq_inflight_dropped_total", "In-flight messages dropped (quota or expiry).", prometheus.CounterValue,
			func(s *mqtt.Server) int64 { return atomic.LoadInt64(&s.Info.InflightDropped) }),
	}}
}

// sessionsInflight counts the in-flight messages of every session. Mochi
// 2.7.9's own count (Info.Inflight) drifts at each resumed session: it
// copies the old connection's in-flight messages to the new one uncounted,
// then counts them out when it clears the old one, and a PUBACK that the
// old connection delivers after the copy counts the message out twice. The
// sum is read at scrape time, one look per session.
func sessionsInflight(s *mqtt.Server) int64 {
	var n int64
	for _, cl := range s.Clients.GetAll() {
		n += int64(cl.State.Inflight.Len())
	}
	return n
}

func (c *serverInfoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.descs {
		ch <- m.desc
	}
}

func (c *serverInfoCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.descs {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, float64(m.value(c.server)))
	}
}
