package bridge_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// takeoverBound is how long a standby configuration agent may take to
// apply a configuration published after the active broker stopped: it
// looks every 2 s at most, and applying a configuration that adds a link
// takes a few management API calls.
const takeoverBound = 10 * time.Second

// TestMultiBrokerConfigAgentStandby: two brokers of one site share its
// configuration queue. The first one's agent applies the configurations;
// the second's stands by (one INFO line, no ERROR) and consumes nothing;
// when the first stops, the second takes over and applies the next
// configuration within takeoverBound.
func TestMultiBrokerConfigAgentStandby(t *testing.T) {
	h := sharedNodes(t)
	const site = "tunis"
	n := h.Node(site)
	queue := bridge.ConfigQueueName(site)
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	// Configurations other tests left for this site would be applied first.
	purgeQueue(t, n.AMQPURL(), queue)
	t.Cleanup(func() {
		_ = bridge.ApplyFederation(context.Background(), bridge.FederationConfig{
			ManagementURL: n.ManagementURL(), Username: rabbitharness.User, Password: rabbitharness.Password,
			Exchanges: []bridge.ExchangeFederation{},
		})
	})

	start := func(id string, logs *testenv.LockedBuffer) *broker.Broker {
		b, err := broker.New(broker.Config{
			MQTTListen:        "127.0.0.1:0",
			Logger:            slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
			AMQPURL:           n.AMQPURL(),
			AMQPManagementURL: n.ManagementURL(),
			Site:              site,
			BrokerID:          id,
		})
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	logsA, logsB := &testenv.LockedBuffer{}, &testenv.LockedBuffer{}
	a := start("cfg-a", logsA)
	require.Eventually(t, func() bool { return queueConsumers(t, n.AMQPURL(), queue) == 1 }, 30*time.Second, 20*time.Millisecond,
		"broker a's configuration agent never consumes %s", queue)
	b := start("cfg-b", logsB)
	require.Eventually(t, func() bool { return strings.Contains(logsB.String(), "configuration agent on standby") }, 30*time.Second, 20*time.Millisecond,
		"broker b never says it stands by; its logs:\n%s", logsB)
	require.True(t, b.Bridge().Connected(), "b's bridge runs beside a's")
	require.Equal(t, 1, queueConsumers(t, n.AMQPURL(), queue), "only a consumes the configuration queue")

	// a applies the first configuration.
	upstream := h.Node("berlin").AMQPURL()
	publishAMQP(t, n.AMQPURL(), queue, configBody(t, upstream, "pubsub.standby1"))
	require.Eventually(t, func() bool { return hasUpstream(rh, "pubsub.standby1") }, takeoverBound, 50*time.Millisecond,
		"a does not apply the first configuration")
	require.Eventually(t, func() bool { return configsApplied(t, a.Bridge()) == 1 }, 5*time.Second, 20*time.Millisecond)
	require.Zero(t, configsApplied(t, b.Bridge()))

	// a stops; the next configuration is b's to apply.
	require.NoError(t, a.Close())
	stopped := time.Now()
	publishAMQP(t, n.AMQPURL(), queue, configBody(t, upstream, "pubsub.standby1", "pubsub.standby2"))
	require.Eventually(t, func() bool { return hasUpstream(rh, "pubsub.standby2") }, takeoverBound, 50*time.Millisecond,
		"b does not take over within %v; its logs:\n%s", takeoverBound, logsB)
	took := time.Since(stopped)
	require.Eventually(t, func() bool { return configsApplied(t, b.Bridge()) == 1 }, 5*time.Second, 20*time.Millisecond)
	t.Logf("b applied the configuration published when a stopped %v later (bound %v)", took.Round(time.Millisecond), takeoverBound)
	require.Contains(t, logsB.String(), "configuration agent taking over")
	require.Equal(t, 1, strings.Count(logsB.String(), "configuration agent on standby"), "the standby is said once")
	require.NotContains(t, logsB.String(), "level=ERROR", "standing by is not an error")
	require.NotContains(t, logsA.String(), "level=ERROR")
	require.Equal(t, 1, queueConsumers(t, n.AMQPURL(), queue), "b consumes the configuration queue now")
}

// configBody is a configuration message federating each exchange from
// upstream.
func configBody(t *testing.T, upstream string, exchanges ...string) []byte {
	t.Helper()
	m := map[string][]map[string]string{}
	for _, x := range exchanges {
		m[x] = []map[string]string{{"uri": upstream}}
	}
	body, err := json.Marshal(m)
	require.NoError(t, err)
	return body
}

// hasUpstream reports whether the node has the per-exchange upstream of
// exchange's first slot.
func hasUpstream(rh *rabbithole.Client, exchange string) bool {
	ups, err := rh.ListFederationUpstreamsIn("/")
	if err != nil {
		return false
	}
	for _, u := range ups {
		if u.Name == bridge.ExchangeUpstreamPrefix+exchange+":0" {
			return true
		}
	}
	return false
}

// queueConsumers returns the consumers of queue as RabbitMQ answers a
// declaration (the management API's figures lag).
func queueConsumers(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Consumers
}

// purgeQueue empties queue, declaring it if needed.
func purgeQueue(t *testing.T, url, queue string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueuePurge(queue, false)
	require.NoError(t, err)
}

// configsApplied returns the bridge's count of configuration messages
// applied, as Prometheus exposes it.
func configsApplied(t *testing.T, br *bridge.Bridge) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(br.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "luffymq_bridge_agent_actions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "config_applied" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("no luffymq_bridge_agent_actions_total{kind=config_applied}")
	return 0
}
