package hooks

import (
	"fmt"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/luffymq/luffymq/scoring"
)

// DefaultMetricsMaxMembers is the default cap on shared-group members with
// series of their own (see MetricsOptions).
const DefaultMetricsMaxMembers = 1000

// OtherMembers is the client_id label value under which members beyond the
// cap are summed, per group.
const OtherMembers = "_other"

// MetricsOptions tunes a MetricsCollector.
type MetricsOptions struct {
	// MaxMembers is the most shared-group members (group and client pairs)
	// given series of their own. Members seen after the cap is reached are
	// summed per group under client_id="_other" until they leave; a member
	// keeps the series it was first given while it stays. Zero or less
	// selects DefaultMetricsMaxMembers.
	MaxMembers int
}

// MetricsCollector exposes the selection state and report counters to
// Prometheus. It reads them at scrape time, so the message path pays
// nothing for metrics.
type MetricsCollector struct {
	hook   *SelectionHook
	engine *scoring.Engine

	selections, pending, serviceTime, processingTime, inflight, predictedWait, online *prometheus.Desc
	groupMembers                                                                      *prometheus.Desc
	reports, oversized, fallbacks                                                     *prometheus.Desc
	redispatched, parked                                                              *prometheus.Desc
	lateBound, held                                                                   *prometheus.Desc

	labels memberLabels
}

// NewMetricsCollector returns a collector for hook and its engine.
func NewMetricsCollector(hook *SelectionHook, opts MetricsOptions) *MetricsCollector {
	if opts.MaxMembers <= 0 {
		opts.MaxMembers = DefaultMetricsMaxMembers
	}
	member := []string{"group", "client_id"}
	capped := fmt.Sprintf(" Members beyond the first %d are summed per group under client_id=%q.", opts.MaxMembers, OtherMembers)
	return &MetricsCollector{
		hook:   hook,
		engine: hook.cfg.Engine,
		selections: prometheus.NewDesc("luffymq_shared_selections_total",
			"Messages of a shared group selected for a member."+capped, member, nil),
		pending: prometheus.NewDesc("luffymq_member_reported_pending",
			"Pending messages in the member's last load report."+capped, member, nil),
		serviceTime: prometheus.NewDesc("luffymq_member_service_time_seconds",
			"Adaptive per-message service-time estimate of the member (0 until it reports one). Not given for the summed members.", member, nil),
		processingTime: prometheus.NewDesc("luffymq_member_processing_time_seconds",
			"Mean of the member's last five reported processing times (the thesis's t_p). Not given for the summed members.", member, nil),
		inflight: prometheus.NewDesc("luffymq_member_inflight",
			"QoS 1/2 deliveries to the member not yet acknowledged."+capped, member, nil),
		predictedWait: prometheus.NewDesc("luffymq_member_predicted_wait_seconds",
			"Predicted wait before the member could start a message handed to it now. Not given for the summed members.", member, nil),
		online: prometheus.NewDesc("luffymq_member_online",
			"1 if the member is connected, 0 if only its session survives."+capped+" (their count of connected members)", member, nil),
		groupMembers: prometheus.NewDesc("luffymq_shared_group_members",
			"Members of the shared group, connected or with a surviving session.", []string{"group"}, nil),
		reports: prometheus.NewDesc("luffymq_load_reports_total",
			"Load reports received, by channel (pingreq, publish) and outcome: accepted, malformed (ignored), oversized (extended PINGREQ over the size limit; the client was disconnected).", []string{"channel", "outcome"}, nil),
		oversized: prometheus.NewDesc("luffymq_load_reports_oversized_total",
			"Extended PINGREQs whose report exceeded the size limit (client disconnected); also in luffymq_load_reports_total{outcome=\"oversized\"}.", nil, nil),
		fallbacks: prometheus.NewDesc("luffymq_selection_fallbacks_total",
			"Messages for which the engine knew no member of a matched group.", nil, nil),
		redispatched: prometheus.NewDesc("luffymq_redispatched_messages_total",
			"Unacknowledged QoS 1/2 messages of departed (or, with --ack-timeout, stalled) shared-group members given to the rest of their group, by outcome: delivered to another member, parked for want of one, dropped from the full park, unroutable (sent under a topic alias); ack_timeout: taken from a connected member that did not acknowledge them within --ack-timeout (also counted as delivered or parked); late_ack: acknowledged by that member afterwards all the same (processed twice).", []string{"outcome"}, nil),
		parked: prometheus.NewDesc("luffymq_redispatch_parked_messages",
			"Re-dispatched messages waiting for a member of their group.", nil, nil),
		lateBound: prometheus.NewDesc("luffymq_late_binding_messages_total",
			"Shared-group messages late binding held at the broker while every member was busy (--hold-lead), by outcome: held, released to a member, overflow (handed over at once, the hold was full), dropped (QoS 0, no member left).", []string{"outcome"}, nil),
		held: prometheus.NewDesc("luffymq_late_binding_held_messages",
			"Shared-group messages held at the broker now (--hold-lead).", nil, nil),
		labels: memberLabels{
			max:      opts.MaxMembers,
			labelled: map[memberKey]struct{}{},
			other:    map[memberKey]uint64{},
			retired:  map[string]uint64{},
		},
	}
}

// Describe sends the descriptors of every metric.
func (c *MetricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.selections, c.pending, c.serviceTime, c.processingTime,
		c.inflight, c.predictedWait, c.online, c.groupMembers, c.reports, c.oversized, c.fallbacks,
		c.redispatched, c.parked, c.lateBound, c.held} {
		ch <- d
	}
}

// Collect sends the current values.
func (c *MetricsCollector) Collect(ch chan<- prometheus.Metric) {
	snapshot := c.engine.Snapshot()
	series := c.labels.assign(snapshot)
	for gi, g := range snapshot {
		constMetric(ch, c.groupMembers, prometheus.GaugeValue, float64(len(g.Members)), g.Filter)
		for mi, m := range g.Members {
			if !series[gi].own[mi] {
				continue
			}
			labels := []string{g.Filter, m.ClientID}
			online := 0.0
			if m.Online {
				online = 1
			}
			constMetric(ch, c.selections, prometheus.CounterValue, float64(m.Selections), labels...)
			constMetric(ch, c.pending, prometheus.GaugeValue, float64(m.ReportedPending), labels...)
			constMetric(ch, c.serviceTime, prometheus.GaugeValue, m.ServiceEstimate.Seconds(), labels...)
			constMetric(ch, c.processingTime, prometheus.GaugeValue, m.ProcessingTime.Seconds(), labels...)
			constMetric(ch, c.inflight, prometheus.GaugeValue, float64(m.InFlight), labels...)
			constMetric(ch, c.predictedWait, prometheus.GaugeValue, m.PredictedWait.Seconds(), labels...)
			constMetric(ch, c.online, prometheus.GaugeValue, online, labels...)
		}
		if o := series[gi].other; o != nil {
			labels := []string{g.Filter, OtherMembers}
			constMetric(ch, c.selections, prometheus.CounterValue, float64(o.selections), labels...)
			if o.members > 0 {
				constMetric(ch, c.pending, prometheus.GaugeValue, float64(o.pending), labels...)
				constMetric(ch, c.inflight, prometheus.GaugeValue, float64(o.inflight), labels...)
				constMetric(ch, c.online, prometheus.GaugeValue, float64(o.online), labels...)
			}
		}
	}
	r := &c.hook.Reports
	for _, via := range []ReportChannel{ViaPingreq, ViaPublish} {
		constMetric(ch, c.reports, prometheus.CounterValue, float64(r.Accepted[via].Load()), via.String(), "accepted")
		constMetric(ch, c.reports, prometheus.CounterValue, float64(r.Malformed[via].Load()), via.String(), "malformed")
	}
	constMetric(ch, c.reports, prometheus.CounterValue, float64(r.Oversized.Load()), ViaPingreq.String(), "oversized")
	constMetric(ch, c.oversized, prometheus.CounterValue, float64(r.Oversized.Load()))
	constMetric(ch, c.fallbacks, prometheus.CounterValue, float64(c.hook.Fallbacks.Load()))
	rd := &c.hook.Redispatch
	for outcome, n := range map[string]uint64{
		"delivered":      rd.Redispatched.Load(),
		"parked":         rd.Parked.Load(),
		"dropped":        rd.ParkedDropped.Load(),
		"unroutable":     rd.Unroutable.Load(),
		"left_to_bridge": rd.LeftToOwner.Load(),
		// Not a share of the outcomes above: why and what came after.
		"ack_timeout": rd.AckTimeouts.Load(),
		"late_ack":    rd.LateAcks.Load(),
	} {
		constMetric(ch, c.redispatched, prometheus.CounterValue, float64(n), outcome)
	}
	constMetric(ch, c.parked, prometheus.GaugeValue, float64(c.hook.ParkedRedispatch()))
	lb := &c.hook.LateBinding
	for outcome, n := range map[string]uint64{
		"held":     lb.Held.Load(),
		"released": lb.Released.Load(),
		"overflow": lb.Overflow.Load(),
		"dropped":  lb.Dropped.Load(),
	} {
		constMetric(ch, c.lateBound, prometheus.CounterValue, float64(n), outcome)
	}
	constMetric(ch, c.held, prometheus.GaugeValue, float64(c.hook.HeldMessages()))
}

// constMetric sends one sample. A label value Prometheus cannot carry (not
// UTF-8) loses its sample instead of failing the scrape.
func constMetric(ch chan<- prometheus.Metric, d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
	if m, err := prometheus.NewConstMetric(d, kind, v, labels...); err == nil {
		ch <- m
	}
}

// memberKey names one member of one group.
type memberKey struct{ group, clientID string }

// otherMembers sums, for one group, the members without series of their
// own.
type otherMembers struct {
	members, online, pending, inflight int
	// selections counts the messages selected for the summed members,
	// present and past, so that it never decreases while the group lives.
	selections uint64
}

// memberLabels decides which members get series of their own: the first
// max members seen, each for as long as it stays in its group. State is
// kept only for members and groups present in the last snapshot.
type memberLabels struct {
	mu       sync.Mutex
	max      int
	labelled map[memberKey]struct{}
	// other holds each summed member's selections at the last scrape.
	other map[memberKey]uint64
	// retired holds, per group, the selections of summed members that
	// left (or whose count restarted because they left and came back).
	retired map[string]uint64
}

// groupSeries says, for one group of a snapshot, which members have
// series of their own (by index) and, if any member is summed or was, the
// sums.
type groupSeries struct {
	own   []bool
	other *otherMembers
}

// assign updates the label assignment to snapshot and returns, for each of
// its groups, which members have series of their own and the sums of the
// others.
func (l *memberLabels) assign(snapshot []scoring.GroupSnapshot) []groupSeries {
	l.mu.Lock()
	defer l.mu.Unlock()
	present := make(map[memberKey]struct{}, len(l.labelled)+len(l.other))
	groups := make(map[string]struct{}, len(snapshot))
	for _, g := range snapshot {
		groups[g.Filter] = struct{}{}
		for _, m := range g.Members {
			present[memberKey{g.Filter, m.ClientID}] = struct{}{}
		}
	}
	for k := range l.labelled {
		if _, ok := present[k]; !ok {
			delete(l.labelled, k)
		}
	}
	for k, last := range l.other {
		if _, ok := present[k]; !ok {
			l.retired[k.group] += last
			delete(l.other, k)
		}
	}
	for g := range l.retired {
		if _, ok := groups[g]; !ok {
			delete(l.retired, g)
		}
	}
	out := make([]groupSeries, len(snapshot))
	for gi, g := range snapshot {
		gs := groupSeries{own: make([]bool, len(g.Members))}
		var sum otherMembers
		for mi, m := range g.Members {
			k := memberKey{g.Filter, m.ClientID}
			if _, ok := l.labelled[k]; ok {
				gs.own[mi] = true
				continue
			}
			last, summed := l.other[k]
			if !summed && len(l.labelled) < l.max && m.ClientID != OtherMembers {
				l.labelled[k] = struct{}{}
				gs.own[mi] = true
				continue
			}
			if m.Selections < last { // it left and came back between scrapes
				l.retired[g.Filter] += last
			}
			l.other[k] = m.Selections
			sum.members++
			if m.Online {
				sum.online++
			}
			sum.pending += m.ReportedPending
			sum.inflight += m.InFlight
			sum.selections += m.Selections
		}
		if n, ok := l.retired[g.Filter]; ok || sum.members > 0 {
			sum.selections += n
			gs.other = &sum
		}
		out[gi] = gs
	}
	return out
}

// tracked returns how many members and groups the assignment holds state
// for (for tests).
func (l *memberLabels) tracked() (members, groups int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.labelled) + len(l.other), len(l.retired)
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

// ConnectionCounterHook counts the MQTT connections the broker accepted (a
// successful CONNACK was sent). It costs one atomic add per connection and
// nothing per message.
type ConnectionCounterHook struct {
	mqtt.HookBase
	// Accepted counts accepted connections since the broker started.
	Accepted atomic.Uint64
}

// ID names the hook.
func (h *ConnectionCounterHook) ID() string { return "luffymq-connection-counter" }

// Provides reports the events the hook handles: OnSessionEstablished.
func (h *ConnectionCounterHook) Provides(b byte) bool { return b == mqtt.OnSessionEstablished }

// OnSessionEstablished counts one accepted connection.
func (h *ConnectionCounterHook) OnSessionEstablished(*mqtt.Client, packets.Packet) {
	h.Accepted.Add(1)
}

// ReconnectOrderCollector exports a ReconnectOrderHook's counters.
type ReconnectOrderCollector struct {
	hook  *ReconnectOrderHook
	waits *prometheus.Desc
}

// NewReconnectOrderCollector returns a collector for hook's counters.
func NewReconnectOrderCollector(hook *ReconnectOrderHook) *ReconnectOrderCollector {
	return &ReconnectOrderCollector{hook: hook, waits: prometheus.NewDesc("luffymq_reconnect_teardown_waits_total",
		"Connections that waited for the teardown of a previous connection with the same client ID whose session ends with it, by kind: closing (it was already closing) or takeover (it was still open and the broker took it over, DISCONNECT 0x8E), and by outcome: done (the teardown finished) or timed_out (they went on after the bound).",
		[]string{"kind", "outcome"}, nil)}
}

// Describe sends the descriptor.
func (c *ReconnectOrderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.waits }

// Collect sends the current values.
func (c *ReconnectOrderCollector) Collect(ch chan<- prometheus.Metric) {
	for _, k := range []struct {
		kind             string
		waited, timedOut uint64
	}{
		{"closing", c.hook.Waited.Load(), c.hook.TimedOut.Load()},
		{"takeover", c.hook.TookOver.Load(), c.hook.TakeoverTimedOut.Load()},
	} {
		ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(k.waited-min(k.timedOut, k.waited)), k.kind, "done")
		ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(k.timedOut), k.kind, "timed_out")
	}
}

// TakeoverCollector exports a TakeoverHook's counters.
type TakeoverCollector struct {
	hook       *TakeoverHook
	deliveries *prometheus.Desc
}

// NewTakeoverCollector returns a collector for hook's counters.
func NewTakeoverCollector(hook *TakeoverHook) *TakeoverCollector {
	return &TakeoverCollector{hook: hook, deliveries: prometheus.NewDesc("luffymq_takeover_deliveries_total",
		"QoS≥1 deliveries Mochi started on a session's previous client object while a new connection resumed the session, by outcome: adopted (moved to the new connection) or missed (no connection resumed the session in time, or the delivery named its topic by the old connection's alias).",
		[]string{"outcome"}, nil)}
}

// Describe sends the descriptor.
func (c *TakeoverCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.deliveries }

// Collect sends the current values.
func (c *TakeoverCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.deliveries, prometheus.CounterValue, float64(c.hook.Adopted()), "adopted")
	ch <- prometheus.MustNewConstMetric(c.deliveries, prometheus.CounterValue, float64(c.hook.Missed()), "missed")
}
