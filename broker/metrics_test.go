package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/hooks"
)

// scrapedMetrics is GET /metrics parsed: families by name.
type scrapedMetrics map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, b *Broker) scrapedMetrics {
	t.Helper()
	text := httpGet(t, "http://"+b.HTTPAddr()+"/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	return families
}

// value returns the sample of family name whose labels include every
// name=value pair of labels (alternating), summed over all that match,
// and how many matched.
func (s scrapedMetrics) value(name string, labels ...string) (sum float64, n int) {
	mf, ok := s[name]
	if !ok {
		return 0, 0
	}
	for _, m := range mf.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		n++
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, n
}

// one returns the single sample of name with labels, failing otherwise.
func (s scrapedMetrics) one(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, n := s.value(name, labels...)
	require.Equal(t, 1, n, "%s%v: want exactly one sample", name, labels)
	return v
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func publishN(t *testing.T, pc *pahoClient, topic string, qos byte, n int, payload []byte) {
	t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := pc.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: payload})
		cancel()
		require.NoError(t, err)
	}
}

// TestMetricsAfterTraffic runs shared and plain traffic, load reports over
// both channels and a retained message through paho clients, then checks
// that every metric family is exported with a plausible value and that
// the exposition passes the Prometheus linter.
func TestMetricsAfterTraffic(t *testing.T) {
	b := startBroker(t, nil)
	addr := b.MQTTAddr()
	w1 := connectPaho(t, addr, "w1", nil)
	w1.subscribe(t, "$share/g/jobs", 1)
	w2 := connectPaho(t, addr, "w2", nil)
	w2.subscribe(t, "$share/g/jobs", 1)
	s1 := connectPaho(t, addr, "s1", nil)
	s1.subscribe(t, "news", 0)
	pub := connectPaho(t, addr, "pub", nil)

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	raw, _ := dialRaw(t, conn, "raw")
	raw.subscribe("$share/r/other", 0)
	raw.writeBytes(report.EncodePingreq(report.Report{Pending: 2, ProcessingTime: 5 * time.Millisecond}))
	require.Equal(t, packets.PINGRESP, raw.read().Type)

	payload := []byte(strings.Repeat("x", 100))
	publishN(t, pub, "jobs", 1, 20, payload)
	publishN(t, pub, "news", 0, 10, payload)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = pub.Publish(ctx, &paho.Publish{Topic: "status/1", QoS: 1, Retain: true, Payload: []byte("up")})
	cancel()
	require.NoError(t, err)
	publishN(t, w1, report.LoadTopic, 1, 1, []byte(`{"msgsInQueue": 0, "processingTimePerMsg": 5}`))
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, err = w1.Publish(ctx, &paho.Publish{Topic: report.LoadTopic, QoS: 0, Payload: []byte(`not json`)})
	cancel()
	require.NoError(t, err)
	eventually(t, 5*time.Second, func() bool { return w1.count()+w2.count() == 20 && s1.count() == 10 })

	var m scrapedMetrics
	eventually(t, 5*time.Second, func() bool {
		m = scrapeMetrics(t, b)
		v, _ := m.value("luffymq_load_reports_total", "channel", "publish", "outcome", "malformed")
		return v == 1
	}, "the malformed QoS 0 report is counted")

	// Connections and sessions.
	require.Equal(t, 5.0, m.one(t, "luffymq_clients_connected"))
	require.Equal(t, 5.0, m.one(t, "luffymq_connections_accepted_total"))
	require.Equal(t, 5.0, m.one(t, "luffymq_clients_connected_peak"))
	require.Equal(t, 5.0, m.one(t, "luffymq_sessions"))
	require.Equal(t, 4.0, m.one(t, "luffymq_subscriptions"))
	require.Equal(t, 1.0, m.one(t, "luffymq_retained_messages"))
	require.Equal(t, 0.0, m.one(t, "luffymq_connect_timeouts_total"))
	refused, n := m.value("luffymq_connections_refused_total")
	require.Equal(t, 2, n, "by limit: listener, ip")
	require.Zero(t, refused)

	// Messages and bytes.
	received := m.one(t, "luffymq_messages_received_total")
	require.GreaterOrEqual(t, received, 33.0, "30 messages, 1 retained, 2 reports")
	require.GreaterOrEqual(t, m.one(t, "luffymq_messages_sent_total"), 30.0)
	require.Greater(t, m.one(t, "luffymq_packets_received_total"), received, "CONNECTs, SUBSCRIBEs and PUBACKs too")
	require.Greater(t, m.one(t, "luffymq_packets_sent_total"), 30.0)
	require.Greater(t, m.one(t, "luffymq_received_bytes_total"), 30*100.0)
	require.Greater(t, m.one(t, "luffymq_sent_bytes_total"), 30*100.0)
	inflight := m.one(t, "luffymq_inflight_messages")
	require.GreaterOrEqual(t, inflight, 0.0)
	require.LessOrEqual(t, inflight, 20.0)
	require.Equal(t, 0.0, m.one(t, "luffymq_inflight_dropped_total"))
	require.Equal(t, 0.0, m.one(t, "luffymq_messages_dropped_total"))
	require.Equal(t, 0.0, m.one(t, "luffymq_qos0_dropped_total", "reason", "outbox_full"))
	slow, n := m.value("luffymq_slow_clients_disconnected_total")
	require.Equal(t, 2, n, "by reason: write_timeout, outbox_full")
	require.Zero(t, slow)

	// Load reports by channel and outcome.
	require.Equal(t, 1.0, m.one(t, "luffymq_load_reports_total", "channel", "pingreq", "outcome", "accepted"))
	require.Equal(t, 0.0, m.one(t, "luffymq_load_reports_total", "channel", "pingreq", "outcome", "malformed"))
	require.Equal(t, 0.0, m.one(t, "luffymq_load_reports_total", "channel", "pingreq", "outcome", "oversized"))
	require.Equal(t, 1.0, m.one(t, "luffymq_load_reports_total", "channel", "publish", "outcome", "accepted"))
	require.Equal(t, 0.0, m.one(t, "luffymq_load_reports_oversized_total"))

	// Selection, per member and per group.
	const group = "$share/g/jobs"
	selections, n := m.value("luffymq_shared_selections_total", "group", group)
	require.Equal(t, 2, n)
	require.Equal(t, 20.0, selections)
	require.Equal(t, 2.0, m.one(t, "luffymq_shared_group_members", "group", group))
	require.Equal(t, 1.0, m.one(t, "luffymq_shared_group_members", "group", "$share/r/other"))
	for _, id := range []string{"w1", "w2"} {
		require.Equal(t, 1.0, m.one(t, "luffymq_member_online", "group", group, "client_id", id))
		require.GreaterOrEqual(t, m.one(t, "luffymq_member_predicted_wait_seconds", "group", group, "client_id", id), 0.0)
		require.GreaterOrEqual(t, m.one(t, "luffymq_member_inflight", "group", group, "client_id", id), 0.0)
		m.one(t, "luffymq_member_service_time_seconds", "group", group, "client_id", id)
		m.one(t, "luffymq_member_processing_time_seconds", "group", group, "client_id", id)
		m.one(t, "luffymq_member_reported_pending", "group", group, "client_id", id)
	}
	require.Equal(t, 5*time.Millisecond.Seconds(), m.one(t, "luffymq_member_processing_time_seconds", "group", "$share/r/other", "client_id", "raw"))
	require.Equal(t, 2.0, m.one(t, "luffymq_member_reported_pending", "group", "$share/r/other", "client_id", "raw"))
	require.Equal(t, 0.0, m.one(t, "luffymq_selection_fallbacks_total"))
	for _, outcome := range []string{"delivered", "parked", "dropped", "unroutable"} {
		require.Equal(t, 0.0, m.one(t, "luffymq_redispatched_messages_total", "outcome", outcome))
	}
	require.Equal(t, 0.0, m.one(t, "luffymq_redispatch_parked_messages"))
	_, n = m.value("luffymq_topic_rules_refusals_total")
	require.Equal(t, 4, n)

	// Go runtime and process.
	require.Greater(t, m.one(t, "go_goroutines"), 0.0)
	require.Greater(t, m.one(t, "go_memstats_heap_inuse_bytes"), 0.0)
	require.Greater(t, m.one(t, "process_resident_memory_bytes"), 0.0)
	require.Greater(t, m.one(t, "process_start_time_seconds"), 0.0)
	require.Greater(t, m.one(t, "process_open_fds"), 0.0)

	// No bridge, no bridge series.
	for name := range m {
		require.False(t, strings.HasPrefix(name, "luffymq_bridge_"), name)
	}

	// Lint: the registry, and the text as served.
	problems, err := testutil.GatherAndLint(b.metricsRegistry())
	require.NoError(t, err)
	require.Empty(t, problems)
	problems, err = promlint.New(strings.NewReader(httpGet(t, "http://"+b.HTTPAddr()+"/metrics"))).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
}

// memberSeries returns the sample keys of scraped families that carry a
// group label.
func memberSeries(m scrapedMetrics) []string {
	var keys []string
	for name, mf := range m {
		for _, s := range mf.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if strings.Contains(strings.Join(labels, ","), "group=") {
				keys = append(keys, name+"{"+strings.Join(labels, ",")+"}")
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// TestMetricsMemberCapAndChurn: with --metrics-max-members 2, members past
// the second are summed under client_id="_other"; once members come and go
// and all leave, no series of theirs or of their group is left.
func TestMetricsMemberCapAndChurn(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.MetricsMaxMembers = 2 })
	addr := b.MQTTAddr()
	const group = "$share/g/jobs"
	pub := connectPaho(t, addr, "pub", nil)
	for round := range 5 {
		var members []*pahoClient
		for i := range 4 {
			pc := connectPaho(t, addr, fmt.Sprintf("w%d-%d", round, i), nil)
			pc.subscribe(t, group, 0)
			members = append(members, pc)
		}
		publishN(t, pub, "jobs", 1, 8, []byte("job"))
		eventually(t, 5*time.Second, func() bool {
			n := 0
			for _, pc := range members {
				n += pc.count()
			}
			return n == 8
		})
		m := scrapeMetrics(t, b)
		_, own := m.value("luffymq_shared_selections_total", "group", group)
		require.Equal(t, 3, own, "round %d: two members and _other", round)
		require.Equal(t, 4.0, m.one(t, "luffymq_member_online", "group", group, "client_id", hooks.OtherMembers)+
			m.one(t, "luffymq_member_online", "group", group, "client_id", fmt.Sprintf("w%d-0", round))+
			m.one(t, "luffymq_member_online", "group", group, "client_id", fmt.Sprintf("w%d-1", round)))
		selected, _ := m.value("luffymq_shared_selections_total", "group", group)
		require.Equal(t, 8.0, selected, "round %d", round)
		for _, pc := range members {
			require.NoError(t, pc.Disconnect(&paho.Disconnect{}))
		}
		eventually(t, 5*time.Second, func() bool { return len(memberSeries(scrapeMetrics(t, b))) == 0 },
			"round %d: series left: %v", round, memberSeries(scrapeMetrics(t, b)))
	}
}

// TestMetricsMaxMembersFlag: the flag reaches the Config, and a negative
// cap is refused.
func TestMetricsMaxMembersFlag(t *testing.T) {
	cfg, err := LoadConfig([]string{"--metrics-max-members", "7"}, nil, nil, nil)
	require.NoError(t, err)
	require.Equal(t, 7, cfg.MetricsMaxMembers)
	cfg, err = LoadConfig(nil, []string{"LUFFYMQ_METRICS_MAX_MEMBERS=9"}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, 9, cfg.MetricsMaxMembers)
	cfg, err = LoadConfig(nil, nil, nil, nil)
	require.NoError(t, err)
	require.Equal(t, hooks.DefaultMetricsMaxMembers, cfg.MetricsMaxMembers)
	_, err = LoadConfig([]string{"--metrics-max-members", "-1"}, nil, nil, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "metrics-max-members")
}

// closedLoopbackPort returns a loopback port nothing listens on.
func closedLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// startBridgedBroker starts a broker whose bridge and site agent point at
// loopback ports where no RabbitMQ answers: the bridge series are
// exported all the same.
func startBridgedBroker(t *testing.T) *Broker {
	t.Helper()
	return startBroker(t, func(c *Config) {
		c.AMQPURL = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", closedLoopbackPort(t))
		c.AMQPManagementURL = fmt.Sprintf("http://127.0.0.1:%d", closedLoopbackPort(t))
		c.Site = "berlin"
		c.Exports = []string{"sensors/#"}
		c.ExportGroups = []string{"$share/g/jobs"}
	})
}

func TestMetricsBridgeSeries(t *testing.T) {
	b := startBridgedBroker(t)
	m := scrapeMetrics(t, b)
	require.Equal(t, 0.0, m.one(t, "luffymq_bridge_link_up", "site", "berlin"))
	for _, name := range []string{"connection_failures_total", "outbox_messages", "bindings"} {
		m.one(t, "luffymq_bridge_"+name, "site", "berlin")
	}
	_, n := m.value("luffymq_bridge_messages_dropped_total", "site", "berlin")
	require.Equal(t, 2, n)
	_, n = m.value("luffymq_bridge_agent_actions_total", "site", "berlin")
	require.Equal(t, 2, n)
	for _, name := range []string{"wq_ttl_seconds", "wq_max_length", "wq_weight", "wq_messages_in_queue"} {
		m.one(t, "luffymq_bridge_"+name, "queue", "wq.g")
	}
	_, n = m.value("luffymq_bridge_wq_messages_received_total", "queue", "wq.g")
	require.Equal(t, 3, n, "by source")
	problems, err := testutil.GatherAndLint(b.metricsRegistry())
	require.NoError(t, err)
	require.Empty(t, problems)
}

// describedNames returns the names of every metric the broker's
// collectors describe, including those with no series yet (a bridge
// exchange nothing was exported to).
func describedNames(b *Broker) map[string]bool {
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range b.metricsCollectors() {
			c.Describe(ch)
		}
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		if match := fqName.FindStringSubmatch(d.String()); match != nil {
			names[match[1]] = true
		}
	}
	return names
}

// TestGrafanaDashboardUsesExportedMetrics parses the example Grafana
// dashboard and checks that every query names metrics a running broker
// (bridge on, with a shared group) exports. Only bridge series that need
// RabbitMQ traffic to appear (per exchange) may be merely described.
func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "examples", "grafana", "luffymq.json"))
	require.NoError(t, err)
	var dashboard struct {
		Title  string `json:"title"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(data, &dashboard))
	require.Equal(t, "LuffyMQ", dashboard.Title)

	type query struct{ where, expr string }
	var queries []query
	for _, p := range dashboard.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, target := range p.Targets {
			queries = append(queries, query{"panel " + p.Title, target.Expr})
		}
	}
	for _, v := range dashboard.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			queries = append(queries, query{"variable " + v.Name, q.Query})
		}
	}
	require.Greater(t, len(queries), 30)

	b := startBridgedBroker(t)
	member := connectPaho(t, b.MQTTAddr(), "w1", nil)
	member.subscribe(t, "$share/g/jobs", 0)
	exported := map[string]bool{}
	for name := range scrapeMetrics(t, b) {
		exported[name] = true
	}
	described := describedNames(b)
	metricName := regexp.MustCompile(`\b(?:luffymq|go|process)_[a-z0-9_]+\b`)
	used := map[string]bool{}
	for _, q := range queries {
		names := metricName.FindAllString(q.expr, -1)
		require.NotEmpty(t, names, "%s: %q names no metric", q.where, q.expr)
		for _, name := range names {
			used[name] = true
			if exported[name] {
				continue
			}
			require.True(t, described[name] && strings.HasPrefix(name, "luffymq_bridge_"),
				"%s: %q uses %s, which the broker does not export", q.where, q.expr, name)
		}
	}
	for _, name := range []string{"luffymq_messages_received_total", "luffymq_shared_selections_total",
		"luffymq_load_reports_total", "luffymq_bridge_wq_messages_in_queue", "process_cpu_seconds_total"} {
		require.True(t, used[name], "the dashboard shows %s", name)
	}
}
