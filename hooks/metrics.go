package hooks

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/luffymq/luffymq/scoring"
)

// MetricsCollector exposes the selection state and report counters to
// Prometheus. It reads them at scrape time, so the message path pays
// nothing for metrics.
type MetricsCollector struct {
	hook   *SelectionHook
	engine *scoring.Engine

	selections, pending, serviceTime, processingTime, inflight, predictedWait, online *prometheus.Desc
	reports, oversized, fallbacks                                                     *prometheus.Desc
	redispatched, parked                                                              *prometheus.Desc
}

// NewMetricsCollector returns a collector for hook and its engine.
func NewMetricsCollector(hook *SelectionHook) *MetricsCollector {
	member := []string{"group", "client_id"}
	return &MetricsCollector{
		hook:   hook,
		engine: hook.cfg.Engine,
		selections: prometheus.NewDesc("luffymq_shared_selections_total",
			"Messages of a shared group selected for a member.", member, nil),
		pending: prometheus.NewDesc("luffymq_member_reported_pending",
			"Pending messages in the member's last load report.", member, nil),
		serviceTime: prometheus.NewDesc("luffymq_member_service_time_seconds",
			"Adaptive per-message service-time estimate of the member (0 until it reports one).", member, nil),
		processingTime: prometheus.NewDesc("luffymq_member_processing_time_seconds",
			"Mean of the member's last five reported processing times (the thesis's t_p).", member, nil),
		inflight: prometheus.NewDesc("luffymq_member_inflight",
			"QoS 1/2 deliveries to the member not yet acknowledged.", member, nil),
		predictedWait: prometheus.NewDesc("luffymq_member_predicted_wait_seconds",
			"Predicted wait before the member could start a message handed to it now.", member, nil),
		online: prometheus.NewDesc("luffymq_member_online",
			"1 if the member is connected, 0 if only its session survives.", member, nil),
		reports: prometheus.NewDesc("luffymq_load_reports_total",
			"Load reports received, by channel and outcome.", []string{"channel", "outcome"}, nil),
		oversized: prometheus.NewDesc("luffymq_load_reports_oversized_total",
			"Extended PINGREQs whose report exceeded the size limit (client disconnected).", nil, nil),
		fallbacks: prometheus.NewDesc("luffymq_selection_fallbacks_total",
			"Messages for which the engine knew no member of a matched group.", nil, nil),
		redispatched: prometheus.NewDesc("luffymq_redispatched_messages_total",
			"Unacknowledged QoS 1/2 messages of departed shared-group members, by outcome: delivered to another member, parked for want of one, dropped from the full park, unroutable (sent under a topic alias).", []string{"outcome"}, nil),
		parked: prometheus.NewDesc("luffymq_redispatch_parked_messages",
			"Re-dispatched messages waiting for a member of their group.", nil, nil),
	}
}

// Describe sends the descriptors of every metric.
func (c *MetricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.selections, c.pending, c.serviceTime, c.processingTime,
		c.inflight, c.predictedWait, c.online, c.reports, c.oversized, c.fallbacks, c.redispatched, c.parked} {
		ch <- d
	}
}

// Collect sends the current values.
func (c *MetricsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.engine.Snapshot() {
		for _, m := range g.Members {
			labels := []string{g.Filter, m.ClientID}
			online := 0.0
			if m.Online {
				online = 1
			}
			ch <- prometheus.MustNewConstMetric(c.selections, prometheus.CounterValue, float64(m.Selections), labels...)
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(m.ReportedPending), labels...)
			ch <- prometheus.MustNewConstMetric(c.serviceTime, prometheus.GaugeValue, m.ServiceEstimate.Seconds(), labels...)
			ch <- prometheus.MustNewConstMetric(c.processingTime, prometheus.GaugeValue, m.ProcessingTime.Seconds(), labels...)
			ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(m.InFlight), labels...)
			ch <- prometheus.MustNewConstMetric(c.predictedWait, prometheus.GaugeValue, m.PredictedWait.Seconds(), labels...)
			ch <- prometheus.MustNewConstMetric(c.online, prometheus.GaugeValue, online, labels...)
		}
	}
	r := &c.hook.Reports
	for _, via := range []ReportChannel{ViaPingreq, ViaPublish} {
		ch <- prometheus.MustNewConstMetric(c.reports, prometheus.CounterValue, float64(r.Accepted[via].Load()), via.String(), "accepted")
		ch <- prometheus.MustNewConstMetric(c.reports, prometheus.CounterValue, float64(r.Malformed[via].Load()), via.String(), "malformed")
	}
	ch <- prometheus.MustNewConstMetric(c.oversized, prometheus.CounterValue, float64(r.Oversized.Load()))
	ch <- prometheus.MustNewConstMetric(c.fallbacks, prometheus.CounterValue, float64(c.hook.Fallbacks.Load()))
	rd := &c.hook.Redispatch
	for outcome, n := range map[string]uint64{
		"delivered":  rd.Redispatched.Load(),
		"parked":     rd.Parked.Load(),
		"dropped":    rd.ParkedDropped.Load(),
		"unroutable": rd.Unroutable.Load(),
	} {
		ch <- prometheus.MustNewConstMetric(c.redispatched, prometheus.CounterValue, float64(n), outcome)
	}
	ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(c.hook.ParkedRedispatch()))
}

// TopicRulesCollector exposes a TopicRulesHook's counters to Prometheus.
type TopicRulesCollector struct {
	hook    *TopicRulesHook
	refused *prometheus.Desc
}

// NewTopicRulesCollector returns a collector for hook's counters.
func NewTopicRulesCollector(hook *TopicRulesHook) *TopicRulesCollector {
	return &TopicRulesCollector{hook: hook, refused: prometheus.NewDesc("luffymq_topic_rules_refusals_total",
		"What the topic rules kept from clients, by rule: subscribe_reserved ($luffy/ filters), publish_reserved ($luffy/ topics other than the client's own load report), retained_dollar and shared_dollar ($ topics kept from filters starting with a wildcard).",
		[]string{"rule"}, nil)}
}

// Describe sends the descriptor.
func (c *TopicRulesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.refused }

// Collect sends the current values.
func (c *TopicRulesCollector) Collect(ch chan<- prometheus.Metric) {
	n := &c.hook.Counters
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n.ReadsRefused.Load()), "subscribe_reserved")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n.PublishesRefused.Load()), "publish_reserved")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n.RetainedWithheld.Load()), "retained_dollar")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n.SharedWithheld.Load()), "shared_dollar")
}
